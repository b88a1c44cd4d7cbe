"""What reaches the webhook from outside: chunked bodies, label values no pod can
carry, and reviews that would skew the steering memory."""

import base64
import http.client
import time

import orjson
import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from extender.scoring.steering import process_memory
from extender.webhook import MAX_STEERED_PER_LABEL
from tests.helpers import ran, run_gunicorn

pytestmark = pytest.mark.django_db


def pod(label):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "ci", "name": "p", "labels": {"ks-pipeline": label}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def review(label, uid="u-1"):
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "ci",
            "object": pod(label),
        },
    }


def mutate(client, body):
    response = client.post("/webhook/mutate", body, content_type="application/json")
    assert response.status_code == 200, response.content
    return orjson.loads(response.content)["response"]


def warm_nodes(count=5):
    for node in range(count):
        for _ in range(5):
            ran("ci-java", node=f"node-{node}")


@pytest.mark.django_db(transaction=True)
def test_a_chunked_review_is_read():
    warm_nodes()
    body = orjson.dumps(review("ci-java"))
    pieces = [body[i : i + 50] for i in range(0, len(body), 50)]
    with run_gunicorn({"KSSCHED_SCORING": "warm"}, workers=1) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request(
                "POST",
                "/webhook/mutate",
                body=iter(pieces),
                headers={"Content-Type": "application/json"},
                encode_chunked=True,
            )
            response = conn.getresponse()
            status, answer = response.status, orjson.loads(response.read())
        finally:
            conn.close()
    assert status == 200, answer
    patch = orjson.loads(base64.b64decode(answer["response"]["patch"]))
    assert patch[0]["path"] == "/spec/affinity"


@pytest.mark.usefixtures("warm")
@pytest.mark.parametrize(
    "label, message",
    [
        ("a-" * 100_000 + "a", "is not a valid Kubernetes label value (200001 char"),
        ("ci\x00java", "contains a NUL character"),
        ("ci java", "is not a valid Kubernetes label value"),
    ],
)
def test_a_label_no_pod_can_carry_is_refused_before_any_query(client, label, message):
    warm_nodes()
    started = time.perf_counter()
    with CaptureQueriesContext(connection) as queries:
        answer = mutate(client, review(label))
    assert time.perf_counter() - started < 0.3
    assert len(queries) == 0
    assert "patch" not in answer
    (warning,) = answer["warnings"]
    assert warning.startswith("ks-scheduler: no node preferences added: Pod label")
    assert message in warning


@pytest.mark.usefixtures("warm")
def test_explain_in_webhook_mode_refuses_a_nul_label_with_a_400(client):
    body = {"Pod": {"metadata": {"labels": {"ks-pipeline": "ci\x00java"}}, "spec": {}}}
    response = client.post(
        "/scheduler/explain?mode=webhook", body, content_type="application/json"
    )
    assert response.status_code == 400
    assert "contains a NUL character" in orjson.loads(response.content)["Error"]


@pytest.mark.usefixtures("warm")
def test_reviews_alone_remember_at_most_a_plausible_fan_out_per_label(client):
    warm_nodes(3)
    for number in range(300):
        mutate(client, review("ci-java", uid=f"fake-{number}"))
    steered = process_memory().steered(
        "ci-java", now=time.time(), window=settings.KSSCHED_WEBHOOK_MEMORY_SECONDS
    )
    assert sum(steered.values()) == MAX_STEERED_PER_LABEL == 64
    # Other labels keep their own room.
    for _ in range(5):
        ran("go", node="node-9")
    mutate(client, review("go", uid="real"))
    assert process_memory().steered("go", now=time.time(), window=120) == {"node-9": 1}
