"""`POST /scheduler/explain`: same input as prioritize, the live scores and why."""

import json

import orjson
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from history.ledger import record_placement
from history.models import NodePolicy
from tests.helpers import load_fixture, pod_body, ran
from tests.test_extender import BAD_BODIES

EXPLAIN_URL = "/scheduler/explain"
PRIORITIZE_URL = "/scheduler/priorities/pipeline"

pytestmark = pytest.mark.django_db


@pytest.fixture
def client():
    return APIClient()


def post(client, url, body):
    if not isinstance(body, bytes):
        body = orjson.dumps(body)
    return client.generic("POST", url, body, content_type="application/json")


@pytest.fixture
def history():
    """A small cluster: warm, partially warm, busy and pinned nodes."""
    for node, keys, times in [
        ("n1", ["ci", "java", "app"], 5),
        ("n2", ["ci", "java"], 3),
        ("n3", ["ci", "java", "app"], 5),
        ("n4", ["ci"], 40),
    ]:
        for _ in range(times):
            ran("-".join(keys), node)
    record_placement(
        pod_uid="u1", namespace="ns", name="a", label="ci-java-app", node="n3"
    )
    NodePolicy.objects.create(key="java", node="n5", action="pin")


NODES = ["n1", "n2", "n3", "n4", "n5", "n6"]


@pytest.mark.parametrize("strategy", ["seed", "warm"])
def test_explain_equals_live_scores(client, settings, history, strategy):
    settings.KSSCHED_SCORING = strategy
    body = pod_body("ci-java-app", NODES)
    live = orjson.loads(post(client, PRIORITIZE_URL, body).content)
    response = post(client, EXPLAIN_URL, body)
    assert response.status_code == 200
    explained = orjson.loads(response.content)
    assert explained["strategy"] == strategy
    assert explained["label"] == "ci-java-app"
    assert [row["node"] for row in explained["nodes"]] == NODES
    assert [row["score"] for row in explained["nodes"]] == [e["Score"] for e in live]


def test_explain_shows_each_rule(client, settings, history):
    settings.KSSCHED_SCORING = "warm"
    rows = orjson.loads(
        post(client, EXPLAIN_URL, pod_body("ci-java-app", NODES)).content
    )
    by_node = {row["node"]: row for row in rows["nodes"]}
    assert by_node["n1"]["matched_segment"] == "ci-java-app$"
    assert by_node["n1"]["raw_count"] == 5
    assert by_node["n1"]["decayed_weight"] == pytest.approx(5.0, rel=1e-3)
    assert by_node["n2"]["matched_segment"] == "ci-java-*"
    assert by_node["n3"]["active_pods"] == 1
    # n3 runs the only active pipeline pod: same label and above the mean load.
    assert by_node["n3"]["hotspot_penalty"] == 2
    assert by_node["n3"]["excess_load"] == pytest.approx(1 - 1.1 / 6, abs=0.01)
    assert by_node["n3"]["load_penalty"] == round(3 * (1 - 1.1 / 6))
    assert by_node["n3"]["penalty"] == 4
    assert by_node["n3"]["score"] == by_node["n1"]["score"] - 4
    assert by_node["n4"]["matched_segment"] == "ci-*"
    assert by_node["n5"]["policy"] == "pin (java)" and by_node["n5"]["score"] == 10
    assert by_node["n6"]["matched_segment"] is None and by_node["n6"]["score"] == 1
    assert by_node["n1"]["score"] > by_node["n2"]["score"] > by_node["n4"]["score"]


def test_strategy_query_parameter_compares(client, settings, history):
    settings.KSSCHED_SCORING = "warm"
    body = pod_body("ci-java-app", NODES)
    seed = orjson.loads(post(client, EXPLAIN_URL + "?strategy=seed", body).content)
    warm = orjson.loads(post(client, EXPLAIN_URL, body).content)
    assert seed["strategy"] == "seed" and warm["strategy"] == "warm"
    settings.KSSCHED_SCORING = "seed"
    live_seed = orjson.loads(post(client, PRIORITIZE_URL, body).content)
    assert [r["score"] for r in seed["nodes"]] == [e["Score"] for e in live_seed]
    assert "decayed_weight" in warm["nodes"][0]
    assert "decayed_weight" not in seed["nodes"][0]


def test_unknown_strategy_is_a_400(client, history):
    response = post(client, EXPLAIN_URL + "?strategy=magic", pod_body("a", ["n1"]))
    assert response.status_code == 400
    assert "unknown scoring strategy 'magic'" in orjson.loads(response.content)["Error"]


@pytest.mark.parametrize(("body", "message"), BAD_BODIES)
def test_bad_input_is_the_same_400_as_prioritize(client, body, message):
    with CaptureQueriesContext(connection) as queries:
        response = post(client, EXPLAIN_URL, body)
    expected = post(client, PRIORITIZE_URL, body)
    assert response.status_code == expected.status_code == 400
    assert orjson.loads(response.content) == orjson.loads(expected.content)
    assert message in orjson.loads(response.content)["Error"]
    assert len(queries) == 0


@pytest.mark.parametrize(
    "fixture", ["prioritize-nodenames.json", "prioritize-nodes.json"]
)
def test_explain_accepts_recorded_scheduler_bodies(client, settings, fixture):
    settings.KSSCHED_SCORING = "warm"
    ran("pipeline1", node="worker-1")
    body = json.loads(load_fixture(fixture))
    rows = orjson.loads(post(client, EXPLAIN_URL, body).content)["nodes"]
    live = orjson.loads(post(client, PRIORITIZE_URL, body).content)
    assert {row["node"]: row["score"] for row in rows} == {
        e["Host"]: e["Score"] for e in live
    }
    assert {row["node"] for row in rows if row["matched_segment"]} == {"worker-1"}


def test_explain_is_post_only(client):
    assert client.get(EXPLAIN_URL).status_code == 405
