"""Webhook mode's scoring: weights from scores, the burst memory, the pipeline pool."""

import threading
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from extender.scoring import steering
from extender.scoring.rules import WarmRules
from extender.scoring.steering import (
    SteeringMemory,
    plan_terms,
    remember_plan,
    weight_for,
    with_steered,
)
from extender.scoring.strategies import WarmStrategy
from history.ledger import increment_key_nodes
from history.models import NodeRecord
from history.reader import empty_history
from history.reader.memory import MemoryHistory
from history.reader.pool import Pool, read_pool
from tests.helpers import place

HOUR = 3600.0


def test_weights_rise_with_the_score_from_1_to_100():
    assert [weight_for(score) for score in range(2, 11)] == [
        11,
        22,
        33,
        44,
        56,
        67,
        78,
        89,
        100,
    ]
    assert weight_for(1) == 1 and weight_for(0) == 1 and weight_for(12) == 100


def test_memory_counts_per_label_and_node_within_the_window():
    memory = SteeringMemory()
    memory.remember("a", "n1", now=100.0, window=60.0)
    memory.remember("a", "n1", now=130.0, window=60.0)
    memory.remember("a", "n2", now=130.0, window=60.0)
    memory.remember("b", "n1", now=130.0, window=60.0)
    assert memory.steered("a", now=130.0, window=60.0) == {"n1": 2, "n2": 1}
    assert memory.steered("b", now=130.0, window=60.0) == {"n1": 1}
    # The first pod leaves the window at 160; the rest at 190.
    assert memory.steered("a", now=160.0, window=60.0) == {"n1": 1, "n2": 1}
    assert memory.steered("a", now=190.0, window=60.0) == {}
    assert memory.steered("c", now=190.0, window=60.0) == {}
    # A window of 0 remembers nothing, even within the same instant.
    memory.remember("a", "n1", now=200.0, window=0.0)
    assert memory.steered("a", now=200.0, window=0.0) == {}


def test_a_steered_pod_stops_counting_once_the_ledger_shows_it_bound():
    memory = SteeringMemory()
    memory.remember("a", "n1", now=100.0, window=60.0)
    memory.remember("a", "n2", now=101.0, window=60.0)
    assert memory.since("a", now=102.0, window=60.0) == 100.0 - steering.CLOCK_SLACK
    # A pod of `a` bound at 100.5 was the oldest steered one: the ledger counts it.
    assert memory.steered("a", now=102.0, window=60.0, bound=[100.5]) == {"n2": 1}
    assert memory.steered("a", now=102.0, window=60.0, bound=[100.5, 101.0]) == {}
    # Bound whole-second stamps may read up to CLOCK_SLACK early.
    assert memory.steered("a", now=102.0, window=60.0, bound=[99.0]) == {"n2": 1}
    # A pod bound before either was admitted retires neither.
    assert memory.steered("a", now=102.0, window=60.0, bound=[90.0]) == {
        "n1": 1,
        "n2": 1,
    }
    assert memory.since("b", now=102.0, window=60.0) is None


def test_the_plan_reads_which_steered_pods_are_bound():
    history = memory_cluster()
    memory = SteeringMemory()
    first = plan(history, memory)
    remember_plan(first, memory=memory, now=60.0, window=120.0)
    asked = []

    def bound_since(label, since):
        asked.append((label, since))
        return [60.0]

    assert plan(history, memory).steered == {first.target: 1}
    assert plan(history, memory, bound_since=bound_since).steered == {}
    assert asked == [("ci-app", 60.0 - steering.CLOCK_SLACK)]


def test_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(steering, "MAX_LABELS", 4)
    monkeypatch.setattr(steering, "MAX_PER_LABEL", 3)
    memory = SteeringMemory()
    for pod in range(5):
        memory.remember("a", "n1", now=float(pod), window=HOUR)
    assert memory.steered("a", now=10.0, window=HOUR) == {"n1": 3}
    for label in "bcdefg":
        memory.remember(label, "n1", now=10.0, window=HOUR)
    assert len(memory._steered) <= 4
    assert memory.steered("g", now=10.0, window=HOUR) == {"n1": 1}


def test_memory_is_thread_safe():
    memory = SteeringMemory()

    def steer():
        for _ in range(500):
            memory.remember("a", "n1", now=1.0, window=HOUR)
            memory.steered("a", now=1.0, window=HOUR)

    threads = [threading.Thread(target=steer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert memory.steered("a", now=1.0, window=HOUR) == {"n1": 1024}


def test_steered_pods_are_added_to_the_active_ones():
    history = empty_history(["a"])
    assert with_steered(history, {}) is history
    history = with_steered(
        with_steered(history, {"n1": 1}), {"n1": 2, "n2": 1}
    )  # two reads in a row
    assert history.active == {"n1": 3, "n2": 1}


def test_steered_pods_count_for_the_load_rule():
    """A steered pod is a pipeline pod its node will run: the load rule counts it as
    the anti-hotspot rule does. Else every pod of a burst for a label with one warm
    node goes there (the anti-hotspot penalty stops at the node's band)."""
    history = replace(empty_history(["a"]), busy={"n1": 2, "n3": 1})
    assert with_steered(history, {"n1": 1, "n2": 2}).busy == {"n1": 3, "n2": 2, "n3": 1}
    lone = MemoryHistory(half_life=HOUR)
    for _ in range(3):
        lone.place(label="ci-app", node="n1", now=0.0)
        lone.finish(label="ci-app", node="n1")
    memory = SteeringMemory()
    targets = []
    for _ in range(4):
        burst = plan(lone, memory, pool=["idle1", "idle2", "idle3"])
        remember_plan(burst, memory=memory, now=60.0, window=120.0)
        targets.append(burst.target)
    # n1 sits at the low end of its band from the first pod on; the load rule lets
    # it take one pod more, then leaves the burst to the resource scores.
    assert targets == ["n1", "n1", None, None]


def memory_cluster():
    history = MemoryHistory(half_life=HOUR)
    for node, keys, times in [
        ("n1", ["ci", "app"], 3),
        ("n2", ["ci", "app"], 3),
        ("n3", ["ci"], 5),
    ]:
        for _ in range(times):
            history.place(label="-".join(keys), node=node, now=0.0)
            history.finish(label="-".join(keys), node=node)
    return history


def plan(history, memory=None, **options):
    return plan_terms(
        label="ci-app",
        memory=memory or SteeringMemory(),
        now=60.0,
        window=120.0,
        max_nodes=options.pop("max_nodes", 20),
        reader=history,
        make_strategy=lambda reader: WarmStrategy(
            rules=WarmRules(), reader=reader, half_life=HOUR
        ),
        bound_since=options.pop("bound_since", lambda label, since: []),
        **options,
    )


def test_plan_names_the_warm_nodes_heaviest_first():
    result = plan(memory_cluster())
    assert [(t.node, t.score, t.weight) for t in result.terms] == [
        ("n1", 9, 89),
        ("n2", 9, 89),
        ("n3", 4, 33),
    ]
    assert result.target == "n1"
    assert [t.node for t in plan(memory_cluster(), max_nodes=1).terms] == ["n1"]
    assert plan(memory_cluster(), max_nodes=1).dropped == ["n2", "n3"]
    assert plan(memory_cluster(), max_nodes=0).terms == []
    assert plan_terms(label="--", memory=SteeringMemory()).terms == []


def test_equal_weights_go_to_the_node_with_fewer_pipeline_pods_first():
    history = memory_cluster()
    history.place(label="go", node="n1", now=50.0)
    assert plan(history).target == "n2"


def test_a_remembered_pod_steers_the_next_one_elsewhere():
    history, memory = memory_cluster(), SteeringMemory()
    first = plan(history, memory)
    remember_plan(first, memory=memory, now=60.0, window=120.0)
    second = plan(history, memory)
    assert (first.target, second.target) == ("n1", "n2")
    assert second.steered == {"n1": 1}
    # n1: 9, less 2 for the steered pod of the label, less 2 for the load rule (the
    # steered pod is one of its pipeline pods, above the mean of three nodes).
    assert {t.node: t.weight for t in second.terms} == {"n2": 89, "n1": 44, "n3": 33}


def test_the_pool_sets_the_mean_of_the_load_rule():
    """A busy warm node keeps its term when only warm nodes are scored, and loses it
    against the mean of a pool of idle nodes."""
    history = memory_cluster()
    for _ in range(3):
        history.place(label="go", node="n1", now=50.0)
    # Every warm score gets a term here: the rule under test is the mean alone.
    alone = {t.node: t.score for t in plan(history, min_score=2).terms}
    pool = [f"idle{i}" for i in range(7)]
    pooled = {t.node: t.score for t in plan(history, pool=pool, min_score=2).terms}
    assert alone["n1"] > pooled.get("n1", 1)
    assert all(node not in pooled for node in pool), "cold nodes get no term"


@pytest.mark.django_db
def test_pool_nodes_are_those_placed_or_seen_recently():
    place("u1", "ci-app", "n1")
    increment_key_nodes(keys=["ci"], node="n2", now=timezone.now() - timedelta(days=9))
    NodeRecord.objects.create(name="n3", uid="x")
    old = NodeRecord.objects.create(name="n4", uid="y")
    NodeRecord.objects.filter(pk=old.pk).update(
        first_seen_at=timezone.now() - timedelta(days=9),
        updated=timezone.now() - timedelta(days=9),
    )
    since = time.time() - 7 * 86400
    assert read_pool(since) == ["n1", "n3"]


@pytest.mark.django_db
def test_webhook_pool_is_read_once_a_minute():
    pool = Pool(read_pool)
    place("u1", "ci-app", "n1")
    now = time.time()
    assert pool.at(now=now, days=7) == ("n1",)
    place("u2", "ci-app", "n2")
    assert pool.at(now=now + 30, days=7) == ("n1",)
    assert pool.at(now=now + 61, days=7) == ("n1", "n2")


def test_a_lukewarm_node_gets_no_term():
    """NodeAffinity gives the heaviest named candidate the full 200 points: a node
    scoring below MIN_TERM_SCORE (here a warm one the load rule takes down) would
    pull as hard as a hot one, so it is not named."""
    history = memory_cluster()
    for _ in range(3):
        history.place(label="go", node="n1", now=50.0)
    low = {t.node: t.score for t in plan(history, pool=["idle"], min_score=2).terms}
    assert low == {"n2": 9, "n3": 4, "n1": 2}
    assert steering.MIN_TERM_SCORE == 4
    default = plan(history, pool=["idle"])
    assert {t.node: t.weight for t in default.terms} == {"n2": 89, "n3": 33}
    assert default.dropped == []
    # Alone it is not named either: the pod is left to the resource scores, where
    # its weight of 22 (score 3) would have earned it the full 200 points.
    lone = MemoryHistory(half_life=HOUR)
    for _ in range(3):
        lone.place(label="ci-app", node="n1", now=0.0)
        lone.finish(label="ci-app", node="n1")
        lone.place(label="go", node="n1", now=50.0)
    pool = ["idle1", "idle2"]
    assert [(t.node, t.weight) for t in plan(lone, pool=pool, min_score=2).terms] == [
        ("n1", 22)
    ]
    assert plan(lone, pool=pool).terms == []
