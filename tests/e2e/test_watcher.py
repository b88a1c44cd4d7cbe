"""The watcher on a real API server, with the ks-scheduler ServiceAccount's RBAC
from deploy/ (not system:masters): exactly once through a restart, two watchers
competing for the real Lease, and a relist after etcd compaction answers 410."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.e2e import stack
from tests.watcher_process import (
    expected_counts,
    ledger_uids,
    stored_counts,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)

LABELS = ["jenkins-java-maven-api", "gitlab-go-build-web", "tekton-node-npm-ui"]


def _bind(plane, namespace, nodes, start, count, finish=True):
    """`count` pipeline pods bound round-robin; {uid: (label, node)}."""
    placed = {}
    for i in range(start, start + count):
        label, node = LABELS[i % len(LABELS)], nodes[i % len(nodes)]
        uid, _ = stack.run_pod(
            plane, namespace, f"pod-{i}", label=label, node=node, finish=finish
        )
        placed[uid] = (label, node)
    return placed


def test_counts_exactly_once_through_a_restart(
    control_plane, namespace, make_nodes, tmp_path
):
    plane = control_plane
    nodes = make_nodes(3)
    placed = {}
    with stack.watcher(plane, tmp_path) as first:
        placed |= _bind(plane, namespace, nodes, 0, 6)
        assert wait_until(lambda: set(placed) <= ledger_uids(), 30), first.log
        first.kill()  # no goodbye: SIGKILL mid-stream
    # While it is down: more pods, and the earlier ones are deleted.
    placed |= _bind(plane, namespace, nodes, 6, 6)
    for i in range(3):
        plane.delete_pod(namespace, f"pod-{i}")
    with stack.watcher(plane, tmp_path, name="watcher-again") as second:
        assert wait_until(lambda: set(placed) <= ledger_uids(), 30), second.log
        assert stack.wait_finished(set(placed))
        assert "Traceback" not in second.log
    assert ours(nodes) == expected_counts(placed), _diff(nodes, placed)


def test_two_watchers_compete_for_the_real_lease(
    control_plane, namespace, make_nodes, tmp_path
):
    plane = control_plane
    nodes = make_nodes(2)
    lease_path = (
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/"
        "ks-scheduler-watcher"
    )
    plane.request("DELETE", lease_path)
    env = {"POD_NAMESPACE": "kube-system"}
    with (
        stack.watcher(
            plane, tmp_path, "--leader-elect", name="a", POD_NAME="a", **env
        ) as a,
        stack.watcher(
            plane, tmp_path, "--leader-elect", name="b", POD_NAME="b", **env
        ) as b,
    ):

        def holder():
            status, lease = plane.request("GET", lease_path)
            return (
                lease.get("spec", {}).get("holderIdentity") if status == 200 else None
            )

        assert wait_until(lambda: holder() is not None, 20)
        first = holder()
        placed = _bind(plane, namespace, nodes, 0, 4)
        assert wait_until(lambda: set(placed) <= ledger_uids(), 30), a.log + b.log
        assert first in ("a", "b")
        leader, standby = (a, b) if first == "a" else (b, a)
        leader.stop()
        assert wait_until(lambda: holder() not in (None, "", first), 30), standby.log
        placed |= _bind(plane, namespace, nodes, 4, 4)
        assert wait_until(lambda: set(placed) <= ledger_uids(), 30), standby.log
        assert stack.wait_finished(set(placed))
    assert ours(nodes) == expected_counts(placed), _diff(nodes, placed)


def test_an_etcd_compaction_answers_410_and_the_watcher_relists(
    control_plane, namespace, make_nodes, tmp_path
):
    from history.models import WatchState

    plane = control_plane
    nodes = make_nodes(2)
    with stack.watcher(plane, tmp_path) as first:
        placed = _bind(plane, namespace, nodes, 0, 3)
        assert wait_until(lambda: set(placed) <= ledger_uids(), 30), first.log
        assert stack.wait_finished(set(placed))
    relists = WatchState.objects.get(name="pods").relists
    # While it is down: new pods and a compaction past its checkpoint.
    placed |= _bind(plane, namespace, nodes, 3, 3)
    for i in range(20):
        plane.ok(
            "PATCH",
            f"/api/v1/nodes/{nodes[0]}",
            {"metadata": {"labels": {"churn": str(i)}}},
            content_type="application/merge-patch+json",
        )
    plane.compact()
    with stack.watcher(plane, tmp_path, name="after-compaction") as second:
        assert wait_until(lambda: set(placed) <= ledger_uids(), 30), second.log
        assert stack.wait_finished(set(placed))
        assert wait_until(
            lambda: WatchState.objects.get(name="pods").relists > relists, 10
        ), second.log
        assert "410" in second.log or "expired" in second.log.lower(), second.log
    assert ours(nodes) == expected_counts(placed), _diff(nodes, placed)


def ours(nodes):
    """The counts on this test's nodes (earlier tests' pods are still in the API
    server, and a new watcher lists them too)."""
    return Counter({key: n for key, n in stored_counts().items() if key[1] in nodes})


def _diff(nodes, placed):
    stored, expected = ours(nodes), expected_counts(placed)
    return {
        key: (stored.get(key, 0), expected.get(key, 0))
        for key in stored.keys() | expected.keys()
        if stored.get(key, 0) != expected.get(key, 0)
    }
