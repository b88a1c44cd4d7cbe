"""Extender mode on a real control plane: kube-scheduler, configured from deploy/,
calls the extender and binds pipeline pods where the same pipeline ran before."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest

from tests.e2e import stack
from tests.helpers import REPO, database_env

pytestmark = pytest.mark.django_db(transaction=True)

LABEL = "jenkins-java-maven-api"
OTHER = "gitlab-go-build-web"


def _history(plane, namespace, nodes, tmp_path):
    """Three finished runs of LABEL on nodes[2] and one of OTHER on nodes[0],
    recorded by the real watcher; returns the uids."""
    uids = set()
    for i in range(3):
        uid, _ = stack.run_pod(
            plane, namespace, f"seed-{i}", label=LABEL, node=nodes[2]
        )
        uids.add(uid)
    uid, _ = stack.run_pod(plane, namespace, "seed-other", label=OTHER, node=nodes[0])
    uids.add(uid)
    assert stack.wait_finished(uids), "the watcher did not record the seed pods"
    return uids


def calls(web: str, verb: str) -> float:
    """How many calls of `verb` the extender answered (/metrics on the web port
    adds up both listeners)."""
    with urllib.request.urlopen(f"{web}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    prefix = f'kssched_extender_request_seconds_count{{verb="{verb}"}}'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    )


PRIORITIZE, FILTER = "priorities/pipeline", "predicates/alwaystrue"
VARIANTS = {
    "deploy": {},
    "filter-verb": {"filterVerb": "predicates/alwaystrue"},
    "no-node-cache": {"nodeCacheCapable": False},
}


@pytest.mark.parametrize("variant", [*VARIANTS, "policy"])
def test_kube_scheduler_binds_pipeline_pods_where_they_ran(
    control_plane, namespace, make_nodes, tmp_path, variant
):
    plane = control_plane
    nodes = make_nodes(4)
    with stack.servers() as (web, extender, _), stack.watcher(plane, tmp_path):
        _history(plane, namespace, nodes, tmp_path)
        if variant == "policy":
            args = stack.policy_scheduler_args(plane, extender)
            scheduler, _port = plane.start_scheduler(f"ks-{variant}", args=args)
        else:
            config = stack.scheduler_config(extender, **VARIANTS[variant])
            scheduler, _port = plane.start_scheduler(f"ks-{variant}", config=config)
        try:
            before = calls(web, PRIORITIZE), calls(web, FILTER)
            placed, kept = {}, []
            for i in range(3):
                uid, node = stack.run_pod(plane, namespace, f"run-{i}", label=LABEL)
                placed[uid] = node
                kept.append(stack.kept_connections(extender))
            # Each run finished before the next: the node that ran it is warm and idle.
            assert set(placed.values()) == {nodes[2]}, placed
            # kube-scheduler made its later calls on the connection of its first
            # (the listeners keep connections: KSSCHED_KEEPALIVE).
            assert kept[0] & kept[2], kept
            # kube-scheduler called prioritize once per pod (and filter, when set).
            time.sleep(1)  # a worker's metrics are written as its answer is sent
            assert calls(web, PRIORITIZE) - before[0] == 3
            filters = 3 if "filterVerb" in VARIANTS.get(variant, {}) else 0
            assert calls(web, FILTER) - before[1] == filters
            assert stack.wait_finished(set(placed))
        finally:
            scheduler.stop()
        log = (tmp_path / "watcher.log").read_text()
        assert "Traceback" not in log
    from history.models import Placement

    assert Placement.objects.filter(label=LABEL, node=nodes[2]).count() == 6


def test_an_ignorable_extender_that_is_down_does_not_stop_scheduling(
    control_plane, namespace, make_nodes, tmp_path
):
    plane = control_plane
    make_nodes(2)
    with stack.servers() as (_web, extender, _):
        pass  # the address of a stopped extender
    config = stack.scheduler_config(extender)
    scheduler, _port = plane.start_scheduler("ks-down", config=config)
    try:
        plane.create_pod(namespace, "while-down", label=LABEL)
        assert plane.wait_bound(namespace, "while-down", timeout=30)
    finally:
        scheduler.stop()


def test_placement_events_show_in_kubectl_describe_and_the_counts_audit_clean(
    control_plane, namespace, make_nodes, tmp_path
):
    plane = control_plane
    nodes = make_nodes(3)
    with stack.servers() as (_web, extender, _), stack.watcher(plane, tmp_path):
        _history(plane, namespace, nodes, tmp_path)
        scheduler, _port = plane.start_scheduler(
            "ks-events", config=stack.scheduler_config(extender)
        )
        try:
            uid, node = stack.run_pod(plane, namespace, "described", label=LABEL)
            assert node == nodes[2]
            assert stack.wait_finished({uid})
        finally:
            scheduler.stop()
        described = ""
        for _ in range(50):
            described = plane.kubectl("describe", "pod", "-n", namespace, "described")
            if "WarmPlacement" in described:
                break
            time.sleep(0.2)
        assert "WarmPlacement" in described, described
        assert nodes[2] in described
    audit = subprocess.run(
        [sys.executable, "manage.py", "audit_counts"],
        cwd=REPO,
        env={**database_env()},
        capture_output=True,
        text=True,
        check=False,
    )
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_a_node_whose_workspace_is_gone_loses_its_pull(
    control_plane, namespace, make_nodes, tmp_path
):
    """KSSCHED_WORKSPACE_DEPTH on a real control plane. LABEL ran three times on
    nodes[2], and a sibling pipeline (the same path but the last segment) once on
    nodes[1]: kube-scheduler binds LABEL's next pod to nodes[2], exact beating
    partial. Then two other pipelines run on nodes[2]; with KSSCHED_WORKSPACE_DEPTH=2
    the extender counts LABEL's workspace there as gone, and kube-scheduler binds
    the next pod to nodes[1], where its path is still warm. (Two nodes where LABEL
    itself ran would both score 9, and kube-scheduler breaks such a tie at
    random.)"""
    plane = control_plane
    nodes = make_nodes(4)

    def scheduled(name, **settings):
        with stack.servers(**settings) as (_web, extender, _):
            config = stack.scheduler_config(extender)
            scheduler, _port = plane.start_scheduler(f"ks-{name}", config=config)
            try:
                return stack.run_pod(plane, namespace, name, label=LABEL)
            finally:
                scheduler.stop()

    with stack.watcher(plane, tmp_path):
        sibling = LABEL.rsplit("-", 1)[0] + "-web"  # partly warm for LABEL
        seeds = [(nodes[1], sibling)] + [(nodes[2], LABEL)] * 3
        uids = {
            stack.run_pod(plane, namespace, f"seed-{i}", label=label, node=node)[0]
            for i, (node, label) in enumerate(seeds)
        }
        assert stack.wait_finished(uids)
        uid, node = scheduled("depth-off")
        assert node == nodes[2]
        assert stack.wait_finished({uid})
        for i in range(2):
            time.sleep(1.1)  # placement times have whole seconds
            other, _ = stack.run_pod(
                plane, namespace, f"other-{i}", label=f"{OTHER}{i}", node=nodes[2]
            )
            assert stack.wait_finished({other})
        uid, node = scheduled("depth-2", KSSCHED_WORKSPACE_DEPTH="2")
        assert node == nodes[1]
        assert stack.wait_finished({uid})
        log = (tmp_path / "watcher.log").read_text()
        assert "Traceback" not in log
