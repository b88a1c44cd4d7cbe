"""On SQLite the history reader answers from a per-thread cache: it must always agree
with the queries it replaces, whoever writes (this connection, another one) and
however."""

import math
import random
import time
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction

from extender.scoring.rules import WarmRules, seed_matches
from extender.scoring.strategies import SeedStrategy, WarmStrategy
from history import corrections, labels, ledger, recency
from history.models import KeyNode, KeyPolicy, NodePolicy
from history.reader import history_reader, memo
from history.watcher import state
from tests.helpers import in_other_connection, ran

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        "connection.vendor != 'sqlite'", reason="the cache serves SQLite only"
    ),
]

NODES = [f"node-{i}" for i in range(40)]
LABELS = ["ci-java-maven-p1", "ci-go-p2", "ci-java-p1", "x-ci-x", "ci"]


def view(keys, nodes, label=None):
    """What the reader says about `nodes`, in a comparable form."""
    label = label or "-".join(keys)
    history = history_reader().read(keys=keys, label=label, nodes=nodes)
    return (
        {node: sorted(history.rows[node]) for node in nodes if node in history.rows},
        {node: history.replaced[node] for node in nodes if node in history.replaced},
        dict(history.active),
        dict(history.busy),
        history.policies,
        seed_matches(keys=keys, rows=history.rows, nodes=nodes),
    )


def queried(keys, nodes=NODES, label=None):
    """The answer of the plain queries (the reader skips the cache in a
    transaction)."""
    with transaction.atomic():
        return view(keys, nodes, label)


def cached(keys, nodes=NODES, label=None):
    assert not connection.in_atomic_block
    return view(keys, nodes, label)


def assert_agree():
    for label in LABELS:
        for keys in (labels.split_pipeline_label(label), labels.path_keys(label)):
            assert cached(keys, label=label) == queried(keys, label=label), label
            assert cached(keys, NODES[5:9], label) == queried(
                keys, NODES[5:9], label
            ), label
        # Seed scores kept between calls match scores computed from the query.
        kept = SeedStrategy().score(label=label, nodes=NODES)
        with transaction.atomic():
            fresh = SeedStrategy().score(label=label, nodes=NODES)
        assert kept == fresh, label


def test_cache_follows_every_kind_of_write():
    rng = random.Random(3)
    for i in range(60):
        ledger.record_placement(
            pod_uid=f"seed-{i}",
            namespace="ns",
            name=f"p{i}",
            label=rng.choice(LABELS),
            node=rng.choice(NODES),
        )
    assert_agree()

    # Placements from another connection (the watcher's process in production).
    def watcher():
        for i in range(30):
            ledger.record_placement(
                pod_uid=f"w-{i}",
                namespace="ns",
                name=f"w{i}",
                label=rng.choice(LABELS),
                node=rng.choice(NODES[:10]),
            )

    in_other_connection(watcher)
    assert_agree()

    # Admin edits on this connection: set, create, reset, halve, delete.
    rows = list(KeyNode.objects.order_by("id"))
    corrections.set_key_node_count(key_node=rows[0], count=0, actor="admin")
    corrections.set_key_node_count(key_node=rows[1], count=5_000_000, actor="admin")
    assert_agree()
    corrections.create_key_node(key="maven", node="node-39", count=4, actor="admin")
    corrections.reset_key_nodes(key_nodes=rows[2:4], actor="admin")
    corrections.halve_key_nodes(key_nodes=rows[4:8], actor="admin")
    assert_agree()
    corrections.delete_key_nodes(key_nodes=rows[8:14], actor="admin")
    assert_agree()

    # Admin edits from another connection, then a duplicate placement (no change).
    in_other_connection(
        lambda: corrections.delete_key_nodes(
            key_nodes=KeyNode.objects.filter(key="ci")[:5], actor="admin"
        )
    )
    assert not ledger.record_placement(
        pod_uid="seed-0", namespace="ns", name="p0", label="ci", node="node-1"
    )
    assert_agree()


def test_cache_survives_a_reconnect_and_a_rolled_back_write():
    ledger.record_placement(
        pod_uid="a", namespace="ns", name="a", label="ci-java", node="node-1"
    )
    assert cached(["ci", "java"])[-1] == {"node-1": (1, 1)}
    connection.close()
    ledger.record_placement(
        pod_uid="b", namespace="ns", name="b", label="ci-java", node="node-2"
    )
    assert cached(["ci", "java"])[-1] == {"node-1": (1, 1), "node-2": (1, 1)}

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        ledger.record_placement(
            pod_uid="c", namespace="ns", name="c", label="ci-java", node="node-3"
        )
        raise Rollback
    assert cached(["ci", "java"]) == queried(["ci", "java"])
    assert "node-3" not in cached(["ci", "java"])[0]


# --- the `warm` strategy's inputs and kept scores -----------------------------------

DAY = 86400.0
WARM_NODES = [*NODES, "stranger"]


def warm_uncached(strategy, label, now):
    with transaction.atomic():
        return (
            strategy.score(label=label, nodes=WARM_NODES, now=now),
            strategy.explain(label=label, nodes=WARM_NODES, now=now),
        )


def assert_warm_agrees(now, strategies=None):
    """Every label's warm scores and explanations, kept and recomputed, agree."""
    strategies = strategies or [WarmStrategy(), WarmStrategy(WarmRules(min_weight=1))]
    for strategy in strategies:
        for label in LABELS:
            assert not connection.in_atomic_block
            kept = strategy.score(label=label, nodes=WARM_NODES, now=now)
            explained = strategy.explain(label=label, nodes=WARM_NODES, now=now)
            scores, explanation = warm_uncached(strategy, label, now)
            assert kept == scores, (label, now)
            assert explained == explanation, (label, now)
            assert kept == [row["score"] for row in explanation]


def place(uid, label, node, at=None):
    ledger.record_placement(
        pod_uid=uid, namespace="ns", name=uid, label=label, node=node, bound_at=at
    )


def test_warm_follows_every_kind_of_write():
    rng = random.Random(5)
    start = time.time()
    # Rows of every age, written straight through the upsert from another
    # connection before anything is cached.
    in_other_connection(
        lambda: [
            ledger.increment_key_nodes(
                keys=labels.placement_keys(rng.choice(LABELS)),
                node=rng.choice(NODES),
                now=datetime.fromtimestamp(start - rng.uniform(0, 40) * DAY, UTC),
            )
            for _ in range(150)
        ]
    )
    for i in range(40):
        place(f"seed-{i}", rng.choice(LABELS), rng.choice(NODES))
    assert_warm_agrees(start)

    # Placements and finishes from another connection (the watcher).
    def watcher():
        for i in range(20):
            place(f"w-{i}", rng.choice(LABELS), rng.choice(NODES[:10]))
        for i in range(0, 40, 3):
            ledger.finish_placement(pod_uid=f"seed-{i}")

    in_other_connection(watcher)
    assert_warm_agrees(start)
    ledger.finish_placement(pod_uid="w-1")
    assert_warm_agrees(start)

    # Admin edits: set, create, reset, halve, delete.
    rows = list(KeyNode.objects.order_by("id"))
    corrections.set_key_node_count(key_node=rows[0], count=0, actor="admin")
    corrections.set_key_node_count(key_node=rows[1], count=3, actor="admin")
    corrections.create_key_node(key="p1", node="stranger", count=4, actor="admin")
    assert_warm_agrees(start)
    corrections.reset_key_nodes(key_nodes=rows[2:6], actor="admin")
    corrections.halve_key_nodes(key_nodes=rows[6:12], actor="admin")
    assert_warm_agrees(start)
    in_other_connection(
        lambda: corrections.delete_key_nodes(key_nodes=rows[12:20], actor="admin")
    )
    assert_warm_agrees(start)

    # Node replacements and policy edits, here and from another connection.
    state.record_node_seen(name="node-3", uid="a")
    state.record_node_seen(name="node-3", uid="b")
    assert_warm_agrees(start)
    in_other_connection(lambda: state.record_node_seen(name="node-4", uid="a"))
    in_other_connection(lambda: state.record_node_seen(name="node-4", uid="b"))
    assert_warm_agrees(start)
    KeyPolicy.objects.create(key="java", weight=2.0)
    NodePolicy.objects.create(key="ci", node="node-7", action="ban")
    NodePolicy.objects.create(key="maven", node="stranger", action="pin")
    assert_warm_agrees(start)
    in_other_connection(lambda: KeyPolicy.objects.filter(key="java").update(weight=0.5))
    assert_warm_agrees(start)
    KeyPolicy.objects.create(key="go", enabled=False)
    NodePolicy.objects.filter(node="node-7").delete()
    assert_warm_agrees(start)

    # Time passing: within a window, across windows, across many half-lives.
    for step in (1, 60, 299, 3023, 3025, 3600, DAY, 7 * DAY, 30 * DAY, 400 * DAY):
        assert_warm_agrees(start + step)
    now = start
    for _ in range(40):
        now += rng.uniform(0, 3 * DAY)
        assert_warm_agrees(now, [WarmStrategy()])
    # And back.
    assert_warm_agrees(start - DAY)


def test_warm_survives_a_reconnect_and_a_rolled_back_write():
    now = time.time()
    place("a", "ci-java", "node-1")
    place("b", "ci-java-maven-p1", "node-2")
    assert_warm_agrees(now)
    connection.close()
    place("c", "ci-java", "node-3")
    assert_warm_agrees(now)

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        place("d", "ci-java", "node-4")
        ledger.finish_placement(pod_uid="a")
        KeyPolicy.objects.create(key="ci", enabled=False)
        raise Rollback
    assert_warm_agrees(now)
    assert (
        WarmStrategy().explain(label="ci-java", nodes=["node-4"], now=now)[0][
            "matched_segment"
        ]
        is None
    )

    # A pod of the label ends as one of another label starts on the same node: the
    # node's load stays, its same-label pods do not.
    place("e", "ci-java-p1", "node-5")
    assert_warm_agrees(now)

    def swap():
        with transaction.atomic():
            ledger.finish_placement(pod_uid="e")
            place("f", "other", "node-5")

    in_other_connection(swap)
    assert_warm_agrees(now)


def test_warm_scores_at_a_recency_boundary():
    """A node whose weight falls below min_weight inside a window is worked out at
    the instant asked about, not at the window's start."""
    rules = WarmRules()
    half_life = recency.half_life_seconds()
    placed = 1_700_000_000.0
    ran("ci-java", node="node-1", now=datetime.fromtimestamp(placed, UTC))
    # The weight is 1 at `placed` and reaches min_weight after log2(1/0.1) halvings.
    forgotten = placed + half_life * math.log2(1 / rules.min_weight)
    strategy = WarmStrategy(rules)
    seen = set()
    for offset in (-2, -1, -0.5, 0, 0.5, 1, 2):
        now = forgotten + offset
        kept = strategy.score(label="ci-java", nodes=WARM_NODES, now=now)
        assert kept == warm_uncached(strategy, "ci-java", now)[0], offset
        seen.add(kept[1])
    # The node was worked out per call, and its score did change.
    assert len(seen) == 2


def test_a_broken_invalidation_is_caught(monkeypatch):
    """The agreement check fails when the kept scores miss a change."""
    now = time.time()
    place("a", "ci-java", "node-1")
    assert_warm_agrees(now)
    # The store forgets to tell what it derived from the rows that they changed.
    monkeypatch.setattr(memo.KeyMemo, "changed", lambda *args, **kwargs: None)
    place("b", "ci-java-maven-p1", "node-2")
    with pytest.raises(AssertionError):
        assert_warm_agrees(now)


def test_warm_starts_over_when_a_change_log_is_full(monkeypatch):
    monkeypatch.setattr(memo, "MAX_CHANGES", 3)
    now = time.time()
    for i in range(8):
        place(f"p{i}", LABELS[i % 3], NODES[i])
        assert_warm_agrees(now)


def test_a_placement_costs_the_next_read_only_what_changed():
    """Running pods are followed pod by pod: after a placement or a finish the
    next read does not read every running pod again, nor the policies and node
    records (their version did not move), and still agrees."""
    from django.test.utils import CaptureQueriesContext

    for i in range(20):
        place(f"run-{i}", LABELS[i % len(LABELS)], NODES[i])
    assert_agree()
    in_other_connection(lambda: place("late", "ci-go-p2", "node-3"))
    in_other_connection(lambda: ledger.finish_placement(pod_uid="run-4"))
    with CaptureQueriesContext(connection) as queries:
        history_reader().read(keys=["ci", "go", "p2"], label="ci-go-p2", nodes=NODES)
    assert not [q for q in queries if "finished_at IS NULL" in q["sql"]], queries
    assert not [q for q in queries if "history_keypolicy" in q["sql"]], queries
    assert_agree()


def test_a_cache_behind_the_pruned_pod_log_reads_the_running_pods_again(
    monkeypatch,
):
    from history.reader import sqlite_cache

    place("a", "ci-go-p2", "node-1")
    assert_agree()
    monkeypatch.setattr(sqlite_cache, "POD_LOG_KEEP", 0)

    def finish_and_prune():
        ledger.finish_placement(pod_uid="a")
        place("b", "ci-go-p2", "node-2")
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM history_podlog")
        place("c", "ci-java-p1", "node-3")

    in_other_connection(finish_and_prune)
    assert_agree()
