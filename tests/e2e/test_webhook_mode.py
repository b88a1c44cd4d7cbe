"""Webhook mode on a real control plane: the API server calls /webhook/mutate over
TLS with deploy/overlays/webhook's configuration, accepts the patches, and the
default scheduler follows them."""

from __future__ import annotations

import ssl
import time
import urllib.request
import uuid

import orjson
import pytest

from tests.e2e import stack

pytestmark = pytest.mark.django_db(transaction=True)

# A label of its own: earlier tests' pods (still in the API server, relisted by the
# watcher) ran jenkins-java-maven-api with no startup difference between nodes.
LABEL = "argo-java-maven-hooked"
DEFAULT = "default-scheduler"


def _affinity(pod: dict) -> dict[str, int]:
    """node -> weight of the preferred terms the webhook added to `pod`."""
    terms = (
        pod["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("preferredDuringSchedulingIgnoredDuringExecution", [])
    )
    return {
        term["preference"]["matchFields"][0]["values"][0]: term["weight"]
        for term in terms
    }


@pytest.fixture
def webhook(control_plane, make_nodes, namespace, tmp_path):
    """Nodes, history, the servers with TLS, the watcher counting pods of any
    scheduler, and the MutatingWebhookConfiguration; yields (nodes, web URL,
    servers' process). The default scheduler is started by each test."""
    plane = control_plane
    nodes = make_nodes(3)
    with (
        stack.servers(plane) as (web, _extender, process),
        stack.watcher(plane, tmp_path, KSSCHED_WATCH_ANY_SCHEDULER="true"),
    ):
        # Seed history before any scheduler runs: LABEL ran 5 times on nodes[1]
        # and once on nodes[2]; warm on nodes[1], it starts in 2 s instead of 60
        # (so what warmth is worth to it is learned as a typical pipeline's).
        uids = set()
        for i, node in enumerate([nodes[1]] * 5 + [nodes[2]]):
            uid, _ = stack.run_pod(
                plane,
                namespace,
                f"seed-{i}",
                label=LABEL,
                node=node,
                scheduler=DEFAULT,
                startup=warm_on(nodes[1], i),
            )
            uids.add(uid)
        assert stack.wait_finished(uids)
        plane.apply(stack.webhook_configuration(plane, web))
        try:
            yield nodes, web, process
        finally:
            plane.request(
                "DELETE",
                "/apis/admissionregistration.k8s.io/v1/"
                "mutatingwebhookconfigurations/ks-scheduler",
            )


def warm_on(node: str, runs_before: int = 1):
    """Startup seconds by node: 2 on `node` once LABEL ran there, else 60."""
    return lambda bound: 2.0 if bound == node and runs_before else 60.0


def _default_scheduler(plane):
    return plane.start_scheduler(
        DEFAULT, args=["--leader-elect=false"], user=DEFAULT, lease="kube-scheduler"
    )[0]


def test_patches_are_accepted_and_a_pipeline_run_back_to_back_stays_warm(
    control_plane, webhook, namespace
):
    """Each run has Succeeded (and the ledger recorded its end) before the next is
    created: none of them may count as running, so every run gets the same weight
    on the warm node and lands there. The API server sends its reviews on one kept
    connection (no TLS handshake per pod)."""
    plane = control_plane
    nodes, web, _ = webhook
    scheduler = _default_scheduler(plane)
    try:
        weights, placed, kept = [], [], []
        for run in range(5):
            uid, node = stack.run_pod(
                plane,
                namespace,
                f"run-{run}",
                label=LABEL,
                scheduler=DEFAULT,
                startup=warm_on(nodes[1]),
            )
            weights.append(_affinity(plane.pod(namespace, f"run-{run}")))
            placed.append(node)
            kept.append(stack.kept_connections(web))
            assert stack.wait_finished({uid})
    finally:
        scheduler.stop()
    assert kept[0] & kept[-1], kept
    assert all(weight == weights[0] for weight in weights), weights
    assert weights[0][nodes[1]] == 100 and weights[0][nodes[2]] < 100
    assert placed == [nodes[1]] * 5


def test_reviews_whose_pods_never_appear_stop_counting_within_seconds(
    control_plane, webhook, namespace, settings
):
    """300 made-up reviews for one label lower its warm node's weight (each is a
    pod steered there as far as the webhook knows), but only for
    KSSCHED_WEBHOOK_MEMORY_SECONDS (15 s by default), not minutes."""
    plane = control_plane
    nodes, web, _ = webhook
    port = web.rsplit(":", 1)[1]
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    for _ in range(300):
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": namespace,
                "name": "",
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "generateName": "fake-",
                        "labels": {"ks-pipeline": LABEL},
                    },
                    "spec": {"containers": [{"name": "c", "image": "i"}]},
                },
            },
        }
        request = urllib.request.Request(
            f"https://127.0.0.1:{port}/webhook/mutate",
            data=orjson.dumps(review),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=context, timeout=5) as answer:
            assert answer.status == 200
    started = time.monotonic()
    plane.create_pod(namespace, "right-after", label=LABEL, scheduler="none")
    lowered = _affinity(plane.pod(namespace, "right-after"))
    # Lowered, or no term at all once the remembered pods take it below the
    # lowest score that gets one (steering.MIN_TERM_SCORE).
    assert lowered.get(nodes[1], 0) < 100, lowered
    time.sleep(max(0.0, 16 - (time.monotonic() - started)))
    plane.create_pod(namespace, "later", label=LABEL, scheduler="none")
    assert _affinity(plane.pod(namespace, "later"))[nodes[1]] == 100


def test_kube_system_pods_are_not_patched_before_1_21(control_plane, webhook):
    """1.20's namespaces have no kubernetes.io/metadata.name label, so the shipped
    namespaceSelector lets kube-system's pods through: the webhook itself leaves
    them alone."""
    plane = control_plane
    labels = plane.ok("GET", "/api/v1/namespaces/kube-system")["metadata"].get(
        "labels", {}
    )
    assert "kubernetes.io/metadata.name" not in labels
    name = f"pipeline-{uuid.uuid4().hex[:8]}"
    plane.create_pod("kube-system", name, label=LABEL, scheduler="none")
    try:
        assert _affinity(plane.pod("kube-system", name)) == {}
    finally:
        plane.delete_pod("kube-system", name)


def test_failure_policy_admits_pods_while_ks_scheduler_is_down(
    control_plane, webhook, namespace
):
    plane = control_plane
    nodes, _web, process = webhook
    process.terminate()
    process.wait(20)
    scheduler = _default_scheduler(plane)
    try:
        started = time.monotonic()
        plane.create_pod(namespace, "while-down", label=LABEL, scheduler=DEFAULT)
        assert time.monotonic() - started < 5  # timeoutSeconds is 2
        assert _affinity(plane.pod(namespace, "while-down")) == {}
        assert plane.wait_bound(namespace, "while-down") in nodes
    finally:
        scheduler.stop()
