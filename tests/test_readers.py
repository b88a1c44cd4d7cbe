"""Every history reader answers the same: the same history read through the SQL
reader, the SQLite cache (on SQLite), the PostgreSQL cache (on PostgreSQL) and the
in-memory store gives identical scores and explanations from every strategy, over
segments (`seed`) and label paths (`warm`)."""

import random
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from extender.scoring.rules import WarmRules
from extender.scoring.strategies import SeedStrategy, WarmStrategy
from history import corrections, ledger
from history.models import KeyNode, KeyPolicy, NodePolicy, NodeRecord, Placement
from history.reader import Policies, history_reader
from history.reader.memory import MemoryHistory
from history.reader.sql import SqlReader
from history.recency import half_life_seconds
from history.watcher.state import record_node_seen

pytestmark = pytest.mark.django_db(transaction=True)

NODES = [f"node-{i:02d}" for i in range(30)]
LABELS = [
    "ci-java-maven-app",
    "ci-java-maven-lib",
    "ci-go-svc",
    "ci-java",
    "ci",
    "ci-py-ci",
    "x-y-z-w-v",
    "ci-handmade",
    "ci-go-svc-extra",
    # The same last segment under other prefixes, and a label under another.
    "gitlab-go-app",
    "gh-app",
    "ci-java-maven-app-nightly",
]


def memory_copy() -> MemoryHistory:
    """The database's history, loaded into the in-memory store."""
    memory = MemoryHistory(half_life=half_life_seconds())
    for key, node, count, weight, at in KeyNode.objects.values_list(
        "key", "node", "count", "decayed_weight", "decayed_at"
    ):
        memory.rows.setdefault(key, {})[node] = (count, weight, at)
    for label, node in Placement.objects.filter(finished_at__isnull=True).values_list(
        "label", "node"
    ):
        by_node = memory.active.setdefault(label, {})
        by_node[node] = by_node.get(node, 0) + 1
        memory.busy[node] = memory.busy.get(node, 0) + 1
    for name, since in NodeRecord.objects.filter(
        replacements__gt=0, history_since__isnull=False
    ).values_list("name", "history_since"):
        memory.replaced[name] = since.timestamp()
    key_policies = {p.key: (p.enabled, p.weight) for p in KeyPolicy.objects.all()}
    node_policies: dict[str, dict[str, str]] = {}
    for p in NodePolicy.objects.all():
        node_policies.setdefault(p.key, {})[p.node] = p.action
    memory.policies = Policies(keys=key_policies, nodes=node_policies)
    for node, key in (
        KeyNode.objects.filter(key__endswith="$", last_placed_at__isnull=False)
        .order_by("node", "-last_placed_at", "-key")
        .values_list("node", "key")
    ):
        memory.recent.setdefault(node, []).append(key)
    return memory


def build_history(rng: random.Random, now: datetime) -> None:
    """Placements of every age, finishes, hand edits, replacements, policies."""
    corrections.create_key_node(key="handmade", node="node-29", count=7, actor="admin")
    corrections.create_key_node(
        key="ci-handmade$", node="node-28", count=3, actor="admin"
    )
    corrections.create_key_node(key="gitlab-*", node="node-27", count=2, actor="admin")
    for i in range(300):
        ledger.record_placement(
            pod_uid=f"p{i}",
            namespace="ci",
            name=f"p{i}",
            label=rng.choice(LABELS),
            node=rng.choice(NODES),
            bound_at=now - timedelta(days=rng.uniform(0, 60)),
        )
    for i in rng.sample(range(300), 200):
        ledger.finish_placement(pod_uid=f"p{i}")
    rows = list(KeyNode.objects.order_by("pk"))
    for row in rng.sample(rows, 15):
        corrections.set_key_node_count(
            key_node=row, count=rng.choice([0, 1, 3, 50, 2000]), actor="admin"
        )
    corrections.halve_key_nodes(key_nodes=rng.sample(rows, 10), actor="admin")
    corrections.delete_key_nodes(key_nodes=rng.sample(rows, 5), actor="admin")
    for node in NODES[:6]:
        record_node_seen(name=node, uid="a", now=now - timedelta(days=40))
    for node in NODES[:3]:
        record_node_seen(
            name=node, uid="b", now=now - timedelta(days=rng.uniform(1, 30))
        )
    KeyPolicy.objects.create(key="lib", enabled=True, weight=1.7)
    KeyPolicy.objects.create(key="py", enabled=False, weight=1.0)
    NodePolicy.objects.create(key="java", node="node-07", action="ban")
    NodePolicy.objects.create(key="go", node="node-11", action="pin")


def answers(reader, label, nodes, now):
    """Scores and explanations of every strategy through `reader`."""
    found = []
    for strategy in (
        SeedStrategy(reader=reader),
        WarmStrategy(reader=reader),
        WarmStrategy(WarmRules(min_weight=1, load_penalty=0), reader=reader),
        # Workspace depths: every reader reads the same recent pipelines.
        WarmStrategy(WarmRules(workspace_depth=1), reader=reader),
        WarmStrategy(WarmRules(workspace_depth=3, min_weight=1), reader=reader),
    ):
        found.append(strategy.score(label=label, nodes=nodes, now=now))
        found.append(strategy.explain(label=label, nodes=nodes, now=now))
    return found


def readers():
    """The readers to compare: name -> reader."""
    cached = history_reader()
    assert not isinstance(cached, SqlReader) or connection.vendor != "sqlite"
    return {"sql": SqlReader(), "cache": cached, "memory": memory_copy()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_reader_gives_the_same_scores_and_explanations(seed):
    rng = random.Random(seed)
    now = timezone.now()
    build_history(rng, now)
    compared = readers()
    gone = 0
    for _ in range(60):
        label = rng.choice([*LABELS, "unknown-label", "ci-unknown"])
        nodes = rng.sample(NODES + ["stranger"], rng.randint(1, len(NODES)))
        when = (now + timedelta(days=rng.choice([0, 0.3, 3, 30]))).timestamp()
        expected = answers(compared["sql"], label, nodes, when)
        for name, reader in compared.items():
            assert answers(reader, label, nodes, when) == expected, (name, label)
        gone += sum(row["workspace"] is not None for row in expected[-1])
    assert gone > 0  # some workspaces counted as gone


def test_readers_agree_after_more_writes_between_reads():
    """A cache that answered once must follow later writes of every kind."""
    rng = random.Random(9)
    now = timezone.now()
    build_history(rng, now)
    when = now.timestamp()
    label, nodes = "ci-java-maven-app", NODES
    compared = readers()
    assert answers(compared["cache"], label, nodes, when) == answers(
        compared["sql"], label, nodes, when
    )
    ledger.record_placement(
        pod_uid="late", namespace="ci", name="late", label=label, node="node-05"
    )
    row = KeyNode.objects.filter(key="app").order_by("pk").first()
    corrections.set_key_node_count(key_node=row, count=999, actor="admin")
    record_node_seen(name="node-04", uid="c", now=datetime.now(UTC))
    KeyPolicy.objects.update_or_create(key="maven", defaults={"weight": 0.5})
    ledger.finish_placement(pod_uid="late")
    compared["memory"] = memory_copy()
    expected = answers(compared["sql"], label, nodes, when)
    for name, reader in compared.items():
        assert answers(reader, label, nodes, when) == expected, name


@pytest.mark.parametrize("budget_mb", [96.0, 0.002])
def test_readers_agree_under_random_labels_writes_and_node_churn(settings, budget_mb):
    """Random labels (new ones too), placements and finishes between reads, nodes
    replaced and new node names appearing, with the cache's default budget and with
    one so small that it drops keys on almost every read."""
    settings.KSSCHED_HISTORY_CACHE_MB = budget_mb
    rng = random.Random(21)
    now = timezone.now()
    build_history(rng, now)
    cached = history_reader()
    churned = list(NODES)
    for step in range(40):
        for _ in range(rng.randint(0, 4)):
            uid = f"w{step}-{rng.random()}"
            ledger.record_placement(
                pod_uid=uid,
                namespace="ci",
                name=uid,
                label=rng.choice([*LABELS, f"ci-new-p{step}"]),
                node=rng.choice(churned),
            )
            if rng.random() < 0.5:
                ledger.finish_placement(pod_uid=uid)
        if step % 7 == 3:
            # An autoscaled node goes and another name takes its place; one
            # that stays is replaced under its name.
            churned[rng.randrange(len(churned))] = f"new-{step}"
            record_node_seen(name=rng.choice(churned), uid=f"u{step}", now=now)
        memory = memory_copy()
        for _ in range(3):
            label = rng.choice([*LABELS, f"ci-new-p{step}", "ci-unknown"])
            nodes = rng.sample(churned + ["stranger"], rng.randint(1, len(churned)))
            when = (now + timedelta(days=rng.choice([0, 0.3, 3]))).timestamp()
            expected = answers(SqlReader(), label, nodes, when)
            assert answers(cached, label, nodes, when) == expected, ("cache", step)
            assert answers(memory, label, nodes, when) == expected, ("memory", step)
    if budget_mb < 1:
        assert len(cached.rows) <= len(LABELS[0].split("-")) + 1
