"""The extender endpoints, with the bodies kube-scheduler really sends."""

import json

import orjson
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from history.ledger import increment_key_nodes
from history.models import KeyNode
from tests.helpers import load_fixture, pod_body

FILTER_URL = "/scheduler/predicates/alwaystrue"
PRIORITIZE_URL = "/scheduler/priorities/pipeline"

pytestmark = pytest.mark.django_db


@pytest.fixture
def client():
    return APIClient()


def post(client, url, body, content_type="application/json"):
    if not isinstance(body, bytes | str):
        body = orjson.dumps(body)
    return client.generic("POST", url, body, content_type=content_type)


def lowercase_envelope(body: dict) -> dict:
    return {key.lower(): value for key, value in body.items()}


def seed(rows):
    for key, node, count in rows:
        KeyNode.objects.create(key=key, node=node, count=count)


# --- filter -----------------------------------------------------------------------


@pytest.mark.parametrize("lowercase", [False, True])
def test_alwaystrue_echoes_node_names(client, lowercase):
    body = json.loads(load_fixture("filter-nodenames.json"))
    if lowercase:
        body = lowercase_envelope(body)
    response = post(client, FILTER_URL, body)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert orjson.loads(response.content) == {
        "Nodes": None,
        "NodeNames": ["worker-2", "worker-3", "worker-1"],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


@pytest.mark.parametrize("lowercase", [False, True])
def test_alwaystrue_echoes_full_nodes_unchanged(client, lowercase):
    body = json.loads(load_fixture("filter-nodes.json"))
    expected_nodes = body["Nodes"]
    if lowercase:
        body = lowercase_envelope(body)
    response = post(client, FILTER_URL, body)
    assert response.status_code == 200
    assert orjson.loads(response.content) == {
        "Nodes": expected_nodes,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    # Node objects come back byte-for-byte equal once re-encoded, odd keys included.
    assert '"Port": 10250' in json.dumps(orjson.loads(response.content)["Nodes"])


def test_alwaystrue_reads_the_compact_wire_body(client):
    compact = orjson.dumps(json.loads(load_fixture("filter-nodenames.json")))
    response = post(client, FILTER_URL, compact)
    assert response.status_code == 200
    assert orjson.loads(response.content)["NodeNames"] == [
        "worker-2",
        "worker-3",
        "worker-1",
    ]


def test_alwaystrue_with_no_candidates_returns_none(client):
    response = post(client, FILTER_URL, {"Pod": {}, "Nodes": None, "NodeNames": []})
    assert response.status_code == 200
    assert orjson.loads(response.content)["NodeNames"] == []


def test_alwaystrue_writes_nothing(client):
    with CaptureQueriesContext(connection) as queries:
        post(client, FILTER_URL, load_fixture("filter-nodenames.json"))
    assert len(queries) == 0


# --- prioritize -------------------------------------------------------------------


@pytest.mark.parametrize("lowercase", [False, True])
@pytest.mark.parametrize(
    "fixture", ["prioritize-nodenames.json", "prioritize-nodes.json"]
)
def test_pipeline_scores_fixture_in_both_node_modes(client, fixture, lowercase):
    seed([("pipeline1", "worker-1", 25)])
    body = json.loads(load_fixture(fixture))
    if lowercase:
        body = lowercase_envelope(body)
    response = post(client, PRIORITIZE_URL, body)
    assert response.status_code == 200
    # One segment: s = 10; worker-1 has a row (10 + 25 // 10 capped at 10);
    # worker-2 has none and scores 1.
    assert orjson.loads(response.content) == [
        {"Host": "worker-2", "Score": 1},
        {"Host": "worker-1", "Score": 10},
    ]


def test_pipeline_matches_the_documented_example(client):
    seed(
        [
            ("a", "node1", 1),
            ("b", "node1", 1),
            ("c", "node2", 10),
            ("d", "node1", 20),
        ]
    )

    def scores(label):
        response = post(client, PRIORITIZE_URL, pod_body(label, ["node1", "node2"]))
        assert response.status_code == 200
        return {row["Host"]: row["Score"] for row in orjson.loads(response.content)}

    # a-b-c: node1's most specific warm segment is b (i=1): int(3.33+3.33) = 6;
    # node2 has c (i=2, count 10): int(6.67 + 3.33 + 1) = 11, capped at 10.
    assert scores("a-b-c") == {"node1": 6, "node2": 10}
    assert scores("z-x-a") == {"node1": 10, "node2": 1}
    assert scores("z-x-y") == {"node1": 1, "node2": 1}


def test_pipeline_without_label_scores_zero(client):
    seed([("a", "node1", 100)])
    response = post(client, PRIORITIZE_URL, pod_body(None))
    assert orjson.loads(response.content) == [
        {"Host": "node1", "Score": 0},
        {"Host": "node2", "Score": 0},
    ]


def test_pipeline_ignores_rows_reset_to_zero(client):
    seed([("a", "node1", 0)])
    response = post(client, PRIORITIZE_URL, pod_body("a"))
    assert orjson.loads(response.content)[0] == {"Host": "node1", "Score": 1}


def test_pipeline_answers_each_node_once(client):
    response = post(client, PRIORITIZE_URL, pod_body("a", ["n1", "n2", "n1"]))
    assert [row["Host"] for row in orjson.loads(response.content)] == ["n1", "n2"]


def test_pipeline_scores_are_integers_even_for_huge_counts(client):
    seed([("a", "node1", 10**15)])
    response = post(client, PRIORITIZE_URL, pod_body("a"))
    assert b'"Score":10' in response.content
    assert b'"Score":10.' not in response.content


@pytest.mark.parametrize("node_count", [2, 50, 2000])
def test_pipeline_makes_one_query_whatever_the_node_count(client, node_count):
    nodes = [f"node-{i}" for i in range(node_count)]
    for i, node in enumerate(nodes[:: max(1, node_count // 20)]):
        increment_key_nodes(keys=["ci", "java", f"p{i}"], node=node)
    with CaptureQueriesContext(connection) as queries:
        response = post(client, PRIORITIZE_URL, pod_body("ci-java-p3", nodes))
    assert response.status_code == 200
    assert len(orjson.loads(response.content)) == node_count
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert not any(
        word in queries[0]["sql"].upper() for word in ("INSERT", "UPDATE", "BEGIN")
    )


def test_pipeline_with_full_nodes_reads_names_from_metadata(client):
    seed([("k", "b", 1)])
    body = {
        "Pod": {"metadata": {"labels": {"ks-pipeline": "k"}}},
        "Nodes": {"metadata": {}, "items": [{"metadata": {"name": n}} for n in "ab"]},
        "NodeNames": None,
    }
    response = post(client, PRIORITIZE_URL, body)
    assert orjson.loads(response.content) == [
        {"Host": "a", "Score": 1},
        {"Host": "b", "Score": 10},
    ]


def test_pipeline_label_key_is_a_setting(client, settings):
    settings.KSSCHED_PIPELINE_LABEL = "example.com/pipeline"
    seed([("k", "node1", 1)])
    body = pod_body("k")
    body["Pod"]["metadata"]["labels"] = {"example.com/pipeline": "k"}
    response = post(client, PRIORITIZE_URL, body)
    assert orjson.loads(response.content)[0] == {"Host": "node1", "Score": 10}


# --- bad input --------------------------------------------------------------------

BAD_BODIES = [
    (b"{not json", "malformed JSON"),
    (b"", "request body is empty"),
    (b"[]", "request body must be a JSON object"),
    (b'"text"', "request body must be a JSON object"),
    (b"{}", "request body is empty"),
    (b'{"Nodes": null, "NodeNames": ["a"]}', "missing Pod"),
    (b'{"Pod": null, "NodeNames": ["a"]}', "missing Pod"),
    (b'{"Pod": [], "NodeNames": ["a"]}', "Pod must be an object"),
    (b'{"Pod": {}, "NodeNames": "a"}', "NodeNames must be a list"),
    (b'{"Pod": {}, "NodeNames": ["a", 3]}', "NodeNames[1] must be a string"),
    (b'{"Pod": {}, "Nodes": []}', "Nodes must be a NodeList"),
    (b'{"Pod": {}, "Nodes": {"items": {}}}', "Nodes.items must be a list"),
    (b"\xff\xfe\x00", "malformed JSON"),
]


@pytest.mark.parametrize("url", [FILTER_URL, PRIORITIZE_URL])
@pytest.mark.parametrize(("body", "message"), BAD_BODIES)
def test_bad_input_is_a_400_that_names_the_problem(client, url, body, message, caplog):
    with CaptureQueriesContext(connection) as queries:
        response = post(client, url, body)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    error = orjson.loads(response.content)["Error"]
    assert message in error
    assert len(queries) == 0
    assert any(
        record.levelname == "WARNING" and message in record.getMessage()
        for record in caplog.records
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"Pod": {"metadata": {"labels": ["x"]}}, "NodeNames": ["a"]},
            "Pod.metadata.labels must be an object",
        ),
        (
            {"Pod": {"metadata": {"labels": {"ks-pipeline": 5}}}, "NodeNames": ["a"]},
            "must be a string",
        ),
        (
            {"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}},
            "Nodes.items[0] has no metadata.name",
        ),
    ],
)
def test_prioritize_rejects_wrong_nested_types(client, body, message):
    response = post(client, PRIORITIZE_URL, body)
    assert response.status_code == 400
    assert message in orjson.loads(response.content)["Error"]


NUL_BODIES = [
    (pod_body("ci-\x00java", ["node1"]), "Pod label 'ks-pipeline'"),
    (pod_body("ci-java", ["node1", "node\x002"]), "NodeNames[1]"),
    (
        {
            "Pod": {"metadata": {"labels": {"ks-pipeline": "ci"}}},
            "Nodes": {"items": [{"metadata": {"name": "node\x001"}}]},
        },
        "Nodes.items[0].metadata.name",
    ),
]


@pytest.mark.parametrize("url", [PRIORITIZE_URL, "/scheduler/explain"])
@pytest.mark.parametrize(("body", "where"), NUL_BODIES)
def test_a_nul_character_in_a_name_or_the_label_is_a_400(client, url, body, where):
    KeyNode.objects.create(key="ci", node="node1", count=3)
    with CaptureQueriesContext(connection) as queries:
        response = post(client, url, body)
    assert response.status_code == 400
    error = orjson.loads(response.content)["Error"]
    assert error.startswith(f"{where} contains a NUL character")
    assert len(queries) == 0


def test_wrong_content_type_is_415_with_json_error(client):
    response = post(client, PRIORITIZE_URL, b"Pod=1", content_type="text/plain")
    assert response.status_code == 415
    assert "text/plain" in orjson.loads(response.content)["Error"]


def test_get_on_extender_route_is_405(client):
    response = client.get(FILTER_URL)
    assert response.status_code == 405
    assert "GET" in orjson.loads(response.content)["Error"]


def test_body_over_the_limit_is_413(client, settings):
    settings.KSSCHED_MAX_BODY_BYTES = 1000
    body = pod_body("a", [f"node-{i}" for i in range(200)])
    response = post(client, PRIORITIZE_URL, body)
    assert response.status_code == 413
    assert "limit of 1000 bytes" in orjson.loads(response.content)["Error"]


def test_extender_accepts_bodies_over_djangos_default_limit(client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = pod_body("a", [f"node-{i}" for i in range(500)])
    assert len(orjson.dumps(body)) > 1000
    response = post(client, FILTER_URL, body)
    assert response.status_code == 200


def test_no_trailing_slash_redirect(client):
    response = post(client, PRIORITIZE_URL + "/", pod_body("a"))
    assert response.status_code == 404


def test_extender_needs_no_csrf_token():
    client = APIClient(enforce_csrf_checks=True)
    response = post(client, FILTER_URL, load_fixture("filter-nodenames.json"))
    assert response.status_code == 200


# --- version ----------------------------------------------------------------------


def test_version_is_plain_text_by_default(client):
    response = client.get("/version")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    from kssched import __version__

    assert response.content.decode().strip() == __version__


def test_version_is_json_when_asked(client, settings):
    settings.KSSCHED_VERSION = "9.9.9-test"
    response = client.get("/version", HTTP_ACCEPT="application/json")
    assert orjson.loads(response.content) == {"version": "9.9.9-test"}
