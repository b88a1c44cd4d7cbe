"""KSSCHED_WORKSPACE_DEPTH: `warm` counts a pipeline's own workspace as gone from a
node where that many other pipelines were placed since it last was.

The depths every reader reads from the history are the ones the workspace report
walks from the ledger (`history.workspaces.NodeOrder`), and the extender's scores,
explain and the webhook's weights follow them."""

import random
import threading
import time
from datetime import timedelta

import orjson
import pytest
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from extender.scoring.rules import GONE_SCORE, NO_HISTORY_SCORE
from extender.scoring.steering import SteeringMemory, plan_terms
from history.depth_feed import process_depth
from history.labels import path_keys
from history.models import LearnedDepth, NodePolicy, Placement
from history.outcomes import WINDOW
from history.reader import history_reader
from history.reader.depths import DEEPEST, KEPT, Recent, recent_sql
from history.reader.sql import SqlReader, read_recent
from history.watcher import housekeeping
from history.workspaces import NodeOrder, learning_since
from kssched.variables import BY_NAME
from tests.helpers import place, pod_body
from tests.test_workspaces import lru_cluster

pytestmark = pytest.mark.django_db(transaction=True)

PRIORITIZE_URL = "/scheduler/priorities/pipeline"
EXPLAIN_URL = "/scheduler/explain"


@pytest.fixture(autouse=True)
def warm(settings):
    settings.KSSCHED_SCORING = "warm"


def depths(reader, label):
    history = reader.read(keys=path_keys(label), label=label, nodes=None, depths=True)
    return dict(history.depths)


def test_every_reader_reads_the_depths_the_placements_were_made_in():
    """Random pipelines over a few nodes, written through the ledger in the order
    they were bound; between batches, the SQL reader and the process cache (warm
    from the batch before, so it must follow the writes) read each pipeline's
    depths, which must be those of the order walked placement by placement."""
    rng = random.Random(5)
    labels = [f"ci-app{i}" for i in range(24)]
    nodes = ["n1", "n2", "n3"]
    order = NodeOrder()
    cached, plain = history_reader(), SqlReader()
    assert not isinstance(cached, SqlReader)
    deep = 0
    start = 2000
    for batch in range(8):
        for step in range(15):
            label, node = rng.choice(labels), rng.choice(nodes)
            at = start - batch * 15 - step  # seconds ago: later placements are newer
            place(f"p{batch}-{step}", label, node, ago=timedelta(seconds=at))
            order.place(node, label)
        for label in labels:
            expected = {
                node: depth
                for node in nodes
                if (depth := order.depth(node, label)) is not None
            }
            assert depths(plain, label) == expected, (batch, label)
            assert depths(cached, label) == expected, (batch, label)
            deep += sum(depth >= 4 for depth in expected.values())
    assert deep > 0
    assert max(depths(plain, "ci-app0").values(), default=0) <= DEEPEST


def test_depths_are_read_only_when_asked_and_only_for_the_pipeline_key():
    place("a", "ci-a", "n1")
    reader = history_reader()
    assert reader.read(keys=path_keys("ci-a"), label="ci-a", nodes=None).depths == {}
    assert depths(reader, "ci-a") == {"n1": 0}
    segments = reader.read(keys=["ci", "a"], label="ci-a", nodes=None, depths=True)
    assert segments.depths == {}  # `seed`'s keys: no pipeline key


@pytest.fixture
def cluster():
    """ci-java-app ran on n1 first, then three other pipelines did; on n2 it ran
    after one other; n3 ran only other pipelines of the same prefix."""
    for uid, label, node, minutes in [
        ("a1", "ci-java-app", "n1", 60),
        ("a2", "ci-java-app", "n1", 55),
        ("b1", "ci-java-lib", "n1", 50),
        ("c1", "ci-java-cli", "n1", 45),
        ("d1", "ci-java-web", "n1", 40),
        ("e1", "ci-java-lib", "n2", 35),
        ("a3", "ci-java-app", "n2", 30),
        ("e2", "ci-java-cli", "n2", 25),
        ("f1", "ci-java-lib", "n3", 20),
    ]:
        place(uid, label, node, ago=timedelta(minutes=minutes), finished=True)


def post(url, label, nodes):
    body = orjson.dumps(pod_body(label, nodes))
    response = APIClient().post(url, body, content_type="application/json")
    assert response.status_code == 200, response.content
    return orjson.loads(response.content)


def scores(label, nodes):
    return {
        entry["Host"]: entry["Score"] for entry in post(PRIORITIZE_URL, label, nodes)
    }


def test_off_by_default_the_history_alone_decides(settings, cluster):
    assert settings.KSSCHED_WORKSPACE_DEPTH == 0
    found = scores("ci-java-app", ["n1", "n2", "n3"])
    assert found["n1"] >= found["n2"] > found["n3"] > NO_HISTORY_SCORE


@pytest.mark.parametrize("limit, gone", [(1, {"n1", "n2"}), (2, {"n1"}), (4, set())])
def test_a_node_whose_workspace_is_gone_scores_one_above_cold(
    settings, cluster, limit, gone
):
    """n1's depth for ci-java-app is 3, n2's 1: from the limit on, the node scores
    GONE_SCORE, below the warm ones and above cold ones; explain says why, and equals
    the live scores."""
    settings.KSSCHED_WORKSPACE_DEPTH = limit
    nodes = ["n1", "n2", "n3", "n4"]
    found = scores("ci-java-app", nodes)
    explained = {
        row["node"]: row for row in post(EXPLAIN_URL, "ci-java-app", nodes)["nodes"]
    }
    assert {node: row["score"] for node, row in explained.items()} == found
    assert explained["n1"]["workspace_depth"] == 3
    assert explained["n2"]["workspace_depth"] == 1
    assert explained["n3"]["workspace_depth"] is None  # it never ran there
    for node in ("n1", "n2"):
        if node in gone:
            assert found[node] == GONE_SCORE
            assert explained[node]["workspace"] == (
                f"workspace gone: {explained[node]['workspace_depth']} other pipelines "
                f"placed here since this one (gone from {limit} on: "
                f"KSSCHED_WORKSPACE_DEPTH)"
            )
        else:
            assert found[node] > GONE_SCORE
            assert explained[node]["workspace"] is None
    assert found["n4"] == NO_HISTORY_SCORE
    # Another pipeline's nodes are its own: ci-java-lib last ran on n3.
    assert scores("ci-java-lib", ["n3"])["n3"] > GONE_SCORE


def test_a_new_placement_brings_the_workspace_back(settings, cluster):
    settings.KSSCHED_WORKSPACE_DEPTH = 2
    assert scores("ci-java-app", ["n1", "n2"])["n1"] == GONE_SCORE
    place("a4", "ci-java-app", "n1", finished=True)
    found = scores("ci-java-app", ["n1", "n2"])
    assert found["n1"] >= found["n2"] > GONE_SCORE


def test_a_pin_still_wins(settings, cluster):
    settings.KSSCHED_WORKSPACE_DEPTH = 1
    NodePolicy.objects.create(key="java", node="n1", action="pin")
    assert scores("ci-java-app", ["n1", "n2"]) == {"n1": 10, "n2": GONE_SCORE}


def test_the_webhook_weights_follow_the_same_rule(settings, cluster):
    """The webhook's plan scores with the same reader and rule: a node whose
    workspace is gone gets no preferred term (it scores below MIN_TERM_SCORE)."""
    settings.KSSCHED_WORKSPACE_DEPTH = 2
    pool = ["n1", "n2", "n3", "n4"]
    plan = plan_terms(label="ci-java-app", memory=SteeringMemory(), pool=pool)
    by_node = dict(zip(plan.nodes, plan.scores, strict=True))
    assert by_node["n1"] == GONE_SCORE
    assert "n1" not in {term.node for term in plan.terms}
    assert "n2" in {term.node for term in plan.terms}
    settings.KSSCHED_WORKSPACE_DEPTH = 0
    plan = plan_terms(label="ci-java-app", memory=SteeringMemory(), pool=pool)
    assert "n1" in {term.node for term in plan.terms}


def test_the_setting_goes_as_deep_as_the_readers_tell_depths_apart():
    with pytest.raises(ValueError):
        BY_NAME["KSSCHED_WORKSPACE_DEPTH"].kind.parse(str(DEEPEST + 1))
    assert BY_NAME["KSSCHED_WORKSPACE_DEPTH"].kind.parse(str(DEEPEST)) == DEEPEST


def explained(label, nodes):
    return {row["node"]: row for row in post(EXPLAIN_URL, label, nodes)["nodes"]}


def test_auto_scores_with_the_depth_the_watcher_measured(settings):
    """`auto`: the watcher's hourly round measures the depth from the outcomes (an
    LRU cache of 2 workspaces per node: 2), stores it, and each extender process
    reads it after a reply; from then on a node where 2 or more other pipelines ran
    since the pipeline scores one above cold."""
    lru_cluster(slots=2)
    nodes = ["n1", "n2", "n3"]
    label, node = next(
        (f"ci-java-p{i}", node)
        for i in range(12)
        for node, depth in depths(SqlReader(), f"ci-java-p{i}").items()
        if depth >= 2 and explained(f"ci-java-p{i}", nodes)[node]["score"] > GONE_SCORE
    )
    before = explained(label, nodes)
    settings.KSSCHED_WORKSPACE_DEPTH = "auto"
    settings.KSSCHED_WORTH_REFRESH_SECONDS = 0.001  # each reply's end reads again
    assert LearnedDepth.objects.count() == 0
    # Nothing measured yet: no workspace counts as gone.
    assert explained(label, nodes) == before
    stop, wake = threading.Event(), threading.Event()
    rounds = threading.Thread(
        target=housekeeping.run,
        args=(stop.is_set, wake),
        kwargs={"first_after": 0.01, "every": 3600, "learn_every": 3600},
    )
    rounds.start()
    try:
        for _ in range(200):
            if LearnedDepth.objects.exists():
                break
            time.sleep(0.05)
    finally:
        stop.set()
        wake.set()
        rounds.join()
    learned = LearnedDepth.objects.get()
    assert (learned.depth, learned.reason) == (2, "")
    explained(label, nodes)  # this reply's end reads the measured depth
    after = explained(label, nodes)
    assert after[node]["score"] == GONE_SCORE
    assert after[node]["workspace"].endswith(
        "(gone from 2 on: KSSCHED_WORKSPACE_DEPTH)"
    )
    # A number set is used as set, whatever was measured.
    settings.KSSCHED_WORKSPACE_DEPTH = 0
    assert explained(label, nodes) == before


def test_auto_with_too_few_outcomes_measures_no_depth_and_demotes_nothing(settings):
    settings.KSSCHED_WORKSPACE_DEPTH = "auto"
    lru_cluster(slots=2, runs=20)
    assert housekeeping.learn_depth_now() == 1
    learned = LearnedDepth.objects.get()
    assert learned.depth is None and "needs" in learned.reason
    process_depth().refresh(force=True)
    assert process_depth().current() == 0
    settings.KSSCHED_WORKSPACE_DEPTH = 0
    assert housekeeping.learn_depth_now() == 0  # not measured unless auto


def test_recent_pipelines_follow_each_change_as_a_fresh_read_would():
    """`Recent.placed` against the truth (every pipeline key's placement time on a
    node): after each change (a placement, one recorded late with an older time, a
    row removed) the kept recent pipelines are the truth's newest KEPT, or None,
    and then a fresh read gives them."""
    rng = random.Random(3)

    def fresh(truth):
        newest = sorted(((at, key) for key, at in truth.items()), reverse=True)
        newest = newest[:KEPT]
        return Recent(tuple(k for _, k in newest), tuple(t for t, _ in newest))

    truth: dict[str, float] = {}
    recent = fresh(truth)
    unknown = 0
    for step in range(3000):
        key = f"p{rng.randrange(30)}$"
        roll = rng.random()
        if roll < 0.1:
            truth.pop(key, None)
        elif roll < 0.25:
            truth[key] = rng.uniform(0, step + 1)  # recorded late
        else:
            truth[key] = step + 1.0
        moved = recent.placed(key, truth.get(key))
        if moved is None:
            unknown += 1
            moved = fresh(truth)
        assert moved == fresh(truth), step
        recent = moved
    assert 0 < unknown < 600  # reads again only now and then


def test_the_recent_pipelines_are_read_from_their_index_alone():
    """The statement repeats the index's condition as each database writes it, so
    the planner can use `keynode_recent_idx` (a covering index on SQLite)."""
    place("a", "ci-a", "n1")
    vendor = connection.vendor
    sql = recent_sql(vendor, 2)
    with transaction.atomic(), connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            # The index gives the order too: a plan that must sort is not it.
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute("EXPLAIN " + sql, [["n1", "n2"]])
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, ["n1", "n2"])
        plan = " ".join(str(row) for row in cursor.fetchall())
    assert "keynode_recent_idx" in plan, plan
    if vendor == "sqlite":
        assert "COVERING INDEX keynode_recent_idx" in plan
    (recent,) = read_recent(["n1", "n2"]).values()
    assert recent.keys == ("ci-a$",)


def test_the_learning_window_holds_at_most_the_newest_placements():
    """`auto`'s measurement reads the last 30 days, or the newest LEARN_ROWS
    placements of them when there are more (the watcher's memory)."""
    lru_cluster(slots=2, runs=50)
    now = timezone.now()
    since = learning_since(now, most=20)
    assert Placement.objects.filter(bound_at__gte=since, bound_at__lt=now).count() == 20
    assert learning_since(now, most=1000) == now - WINDOW
