"""Warm means this pipeline ran here: pods placed through the real watcher, then
scored by prioritize, explained, and steered by the webhook.

For `jenkins-java-maven-api`, a node that ran only `gitlab-go-build-api` (the same
service name in another CI system) is no warmer than a node that ran nothing, a
node that ran `jenkins-java-maven-web` (the same path, another service) is partly
warm, and a node that ran `jenkins-java-maven-api` itself is warmest. The ledger
judges the next pod on each node the same way.
"""

import orjson
import pytest
from rest_framework.test import APIClient

from history.models import Placement
from tests.admission_reviews import answer, new_pod, patched, preferred_nodes, review
from tests.fakeapi import make_pod
from tests.helpers import pod_body, watch_once

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("warm")]

LABEL = "jenkins-java-maven-api"
# node -> the pipelines that ran there before; `gitlab` ran most often, so the old
# segment model (where its `api` made the node "exact") would have ranked it first.
RAN = {
    "same-service": ["gitlab-go-build-api"] * 6,
    "same-path": ["jenkins-java-maven-web"],
    "same-pipeline": [LABEL],
    "fresh": [],
}
NODES = list(RAN)


@pytest.fixture
def history(server, tmp_path):
    """The pods of RAN, bound and finished, recorded by the real watcher."""
    for node, labels in RAN.items():
        for i, label in enumerate(labels):
            pod = make_pod(f"{node}-{i}", label=label, node=node, phase="Succeeded")
            server.add_pod(pod)
    watch_once(server, tmp_path)
    assert Placement.objects.count() == sum(map(len, RAN.values()))


def prioritize(client):
    response = client.post(
        "/scheduler/priorities/pipeline",
        orjson.dumps(pod_body(LABEL, NODES)),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    return {entry["Host"]: entry["Score"] for entry in orjson.loads(response.content)}


def test_prioritize_ranks_this_pipeline_then_its_path_and_ignores_the_service_name(
    history,
):
    scores = prioritize(APIClient())
    assert scores["same-pipeline"] > scores["same-path"] > scores["same-service"]
    assert scores["same-service"] == scores["fresh"]


def test_explain_names_the_key_that_made_each_node_warm(history):
    response = APIClient().post(
        "/scheduler/explain",
        orjson.dumps(
            {
                "Pod": {"metadata": {"labels": {"ks-pipeline": LABEL}}},
                "NodeNames": NODES,
            }
        ),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    rows = {row["node"]: row for row in orjson.loads(response.content)["nodes"]}
    assert rows["same-pipeline"]["matched_segment"] == "jenkins-java-maven-api$"
    assert rows["same-path"]["matched_segment"] == "jenkins-java-maven-*"
    assert rows["same-service"]["matched_segment"] is None
    assert rows["fresh"]["matched_segment"] is None


def test_the_webhook_prefers_this_pipeline_then_its_path_only(history):
    pod = new_pod(label=LABEL)
    weights = preferred_nodes(patched(pod, answer(APIClient(), review(pod))))
    assert set(weights) == {"same-pipeline", "same-path"}
    assert weights["same-pipeline"] > weights["same-path"]


def test_the_ledger_judges_the_next_pod_on_each_node_the_same_way(
    history, server, tmp_path
):
    for node in NODES:
        server.add_pod(make_pod(f"next-{node}", label=LABEL, node=node))
    watch_once(server, tmp_path)
    judged = dict(
        Placement.objects.filter(name__startswith="next-").values_list("node", "warmth")
    )
    assert judged == {
        "same-pipeline": "exact",
        "same-path": "partial",
        "same-service": "cold",
        "fresh": "cold",
    }
