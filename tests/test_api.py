"""History API: read-only, authenticated, filtered and paginated, with a schema."""

from datetime import timedelta

import pytest
import yaml
from django.contrib.auth.models import Group, User
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from history.corrections import create_key_node
from tests.helpers import place, placement_counts

pytestmark = pytest.mark.django_db

ENDPOINTS = ["/api/keys/", "/api/keys/maven/nodes/", "/api/placements/", "/api/schema/"]


@pytest.fixture
def viewer():
    user = User.objects.create_user("viewer", password="s3cret-pass")
    user.groups.add(Group.objects.get(name="ks-scheduler viewers"))
    return user


@pytest.fixture
def api(viewer):
    client = APIClient()
    client.force_login(viewer)
    return client


@pytest.fixture
def history():
    place("a", "jenkins-java-maven", "worker-1", ago=timedelta(hours=50))
    place("b", "jenkins-java-maven", "worker-2", ago=timedelta(hours=5), finished=True)
    place("c", "jenkins-javascript", "worker-2", ago=timedelta(hours=1))
    create_key_node(key="maven", node="worker-3", count=7, actor="admin")


@pytest.mark.parametrize("url", ENDPOINTS)
def test_anonymous_requests_are_refused(url):
    response = APIClient().get(url)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


@pytest.mark.parametrize("url", ENDPOINTS)
def test_users_without_view_permission_are_refused(history, url):
    client = APIClient()
    client.force_login(User.objects.create_user("nobody", password="x-long-pass"))
    response = client.get(url, HTTP_ACCEPT="application/json")
    assert response.status_code == 403
    assert "view permission" in response.json()["detail"]


def test_token_authentication(viewer, history):
    token = Token.objects.create(user=viewer)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert client.get("/api/keys/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert client.get("/api/keys/").status_code == 401


def test_keys_with_totals_and_node_counts(api, history):
    response = api.get("/api/keys/", {"kind": "segment"})
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 4
    rows = {row["key"]: (row["total"], row["nodes"]) for row in body["results"]}
    assert rows == {
        "jenkins": (3, 2),
        "java": (2, 2),
        "maven": (9, 3),
        "javascript": (1, 1),
    }
    assert [row["key"] for row in body["results"]][0] == "maven"
    assert {row["kind"] for row in body["results"]} == {"segment"}


def test_keys_of_every_kind(api, history):
    """The keys listing holds the label-path keys too, each with its kind; the
    totals are those of the placements (and the hand-made maven row)."""
    placed = placement_counts(
        ("jenkins-java-maven", "worker-1"),
        ("jenkins-java-maven", "worker-2"),
        ("jenkins-javascript", "worker-2"),
    )
    body = api.get("/api/keys/", {"page_size": 100}).json()
    rows = {row["key"]: (row["kind"], row["total"]) for row in body["results"]}
    assert body["count"] == len(rows) == len({key for key, _ in placed})
    assert rows["jenkins-*"] == ("prefix", 3)
    assert rows["jenkins-java-*"] == ("prefix", 2)
    assert rows["jenkins-java-maven$"] == ("pipeline", 2)
    assert rows["jenkins-javascript$"] == ("pipeline", 1)
    assert rows["maven"] == ("segment", 9)
    for kind in ("prefix", "pipeline"):
        listed = api.get("/api/keys/", {"kind": kind, "page_size": 100}).json()
        assert sorted(row["key"] for row in listed["results"]) == sorted(
            key for key, (of, _) in rows.items() if of == kind
        )
    # A label-path key's rows, per node.
    nodes = api.get("/api/keys/jenkins-java-*/nodes/").json()["results"]
    assert [(row["node"], row["count"]) for row in nodes] == [
        ("worker-1", 1),
        ("worker-2", 1),
    ]
    assert api.get("/api/keys/", {"kind": "label"}).status_code == 400


def test_keys_search_and_pagination(api, history):
    body = api.get("/api/keys/", {"search": "java", "kind": "segment"}).json()
    assert sorted(row["key"] for row in body["results"]) == ["java", "javascript"]
    body = api.get("/api/keys/", {"search": "javas"}).json()
    assert sorted(row["key"] for row in body["results"]) == [
        "javascript",
        "jenkins-javascript$",
        "jenkins-javascript-*",
    ]
    first = api.get("/api/keys/", {"page_size": 2, "kind": "segment"}).json()
    assert (first["count"], len(first["results"])) == (4, 2)
    assert first["previous"] is None and "page=2" in first["next"]
    second = api.get(first["next"]).json()
    keys = [row["key"] for row in first["results"] + second["results"]]
    assert len(set(keys)) == 4


def test_nodes_of_a_key(api, history):
    body = api.get("/api/keys/maven/nodes/").json()
    assert [(r["node"], r["count"]) for r in body["results"]] == [
        ("worker-3", 7),
        ("worker-1", 1),
        ("worker-2", 1),
    ]
    assert set(body["results"][0]) == {
        "key",
        "node",
        "count",
        "last_placed_at",
        "created",
        "updated",
    }


def test_nodes_of_an_unknown_key_is_404(api, history):
    response = api.get("/api/keys/nope/nodes/")
    assert response.status_code == 404
    assert "nope" in response.json()["detail"]


@pytest.mark.parametrize(
    ("url", "params", "name"),
    [
        ("/api/keys/mav%00en/nodes/", {}, "key"),
        ("/api/keys/", {"search": "ja\x00va"}, "search"),
        ("/api/placements/", {"node": "worker\x001"}, "node"),
        ("/api/placements/", {"key": "ja\x00va"}, "key"),
        ("/api/placements/", {"label": "\x00"}, "label"),
    ],
)
def test_a_nul_character_in_the_path_or_query_is_a_400(api, history, url, params, name):
    response = api.get(url, params)
    assert response.status_code == 400
    assert "NUL character" in response.json()[name][0]


def uids(api, **params):
    response = api.get("/api/placements/", params)
    assert response.status_code == 200, response.content
    return sorted(row["pod_uid"] for row in response.json()["results"])


def test_placements_filters(api, history):
    assert uids(api) == ["a", "b", "c"]
    assert uids(api, key="java") == ["a", "b"]
    assert uids(api, key="javascript") == ["c"]
    # A label-path key matches the placements that count under it.
    assert uids(api, key="jenkins-*") == ["a", "b", "c"]
    assert uids(api, key="jenkins-java-*") == ["a", "b"]
    assert uids(api, key="jenkins-java$") == []
    assert uids(api, key="jenkins-javascript$") == ["c"]
    assert uids(api, node="worker-2") == ["b", "c"]
    assert uids(api, label="jenkins-javascript") == ["c"]
    assert uids(api, active="true") == ["a", "c"]
    assert uids(api, active="false") == ["b"]
    since = (timezone.now() - timedelta(hours=10)).isoformat()
    until = (timezone.now() - timedelta(hours=2)).isoformat()
    assert uids(api, since=since) == ["b", "c"]
    assert uids(api, since=since, until=until) == ["b"]
    assert uids(api, key="java", node="worker-2", active="false") == ["b"]


def test_placement_rows_newest_first(api, history):
    rows = api.get("/api/placements/").json()["results"]
    assert [row["pod_uid"] for row in rows] == ["c", "b", "a"]
    assert rows[1]["active"] is False and rows[0]["active"] is True
    assert rows[1]["finished_at"] is not None


def test_bad_filter_values_get_a_clear_400(api, history):
    response = api.get("/api/placements/", {"since": "yesterday"})
    assert response.status_code == 400
    assert "since" in response.json()


def test_api_is_read_only(api, history):
    for url in ENDPOINTS[:3]:
        assert api.post(url, {}, format="json").status_code == 405
        assert api.delete(url).status_code == 405


def test_schema_documents_the_history_api_only(api):
    response = api.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert set(schema["paths"]) == {
        "/api/keys/",
        "/api/keys/{key}/nodes/",
        "/api/placements/",
        "/api/outcomes/",
        "/api/outcomes/workspaces/",
    }
    params = {
        p["name"] for p in schema["paths"]["/api/placements/"]["get"]["parameters"]
    }
    assert {"key", "node", "label", "since", "until", "active", "page"} <= params
    params = {p["name"] for p in schema["paths"]["/api/keys/"]["get"]["parameters"]}
    assert {"search", "kind", "page"} <= params
    as_yaml = yaml.safe_load(api.get("/api/schema/").content)
    assert as_yaml["info"]["title"] == "ks-scheduler history API"


def test_browsable_api_renders_for_people(api, history):
    response = api.get("/api/placements/", HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    assert b"jenkins-java-maven" in response.content


def test_extender_routes_stay_unauthenticated():
    response = APIClient().get("/version", HTTP_ACCEPT="application/json")
    assert response.status_code == 200


def test_api_root_lists_the_endpoints(api):
    response = api.get("/api/")
    assert response.status_code == 200
    assert response.json() == {
        "keys": "http://testserver/api/keys/",
        "key_nodes": "http://testserver/api/keys/{key}/nodes/",
        "placements": "http://testserver/api/placements/",
        "outcomes": "http://testserver/api/outcomes/",
        "workspaces": "http://testserver/api/outcomes/workspaces/",
        "schema": "http://testserver/api/schema/",
    }
    for url in response.json().values():
        if "{key}" not in url:
            assert api.get(url).status_code == 200, url


def test_api_root_asks_anonymous_callers_to_authenticate():
    response = APIClient().get("/api/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
