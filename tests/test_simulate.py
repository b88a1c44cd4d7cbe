"""The simulator: deterministic, runs the real strategies, and warm earns its place."""

import random
import re
from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from io import StringIO

import orjson
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from extender.scoring.admissions import WebhookAdmissions
from extender.scoring.default_profile import (
    PLUGIN_WEIGHTS,
    affinity_points,
    node_affinity_scores,
    scored_nodes,
)
from extender.scoring.rules import WarmRules, seed_matches
from extender.scoring.scenarios import (
    SCENARIOS,
    Pod,
    Scenario,
    Workload,
    measured_costs,
    pipeline_costs,
    pipeline_labels,
    shared_name_share,
    synthetic_workload,
)
from extender.scoring.simulation import (
    format_table,
    run,
    simulate,
    with_options,
)
from extender.scoring.strategies import WarmStrategy, warm_inputs
from extender.scoring.whatif import (
    LRU_DEPTH,
    READ_EVERY,
    Recency,
    TrueWorth,
    held_only,
)
from history.labels import path_keys
from history.ledger import record_outcome, record_placement
from history.models import Placement
from history.reader.memory import MemoryHistory
from history.workspaces import NodeOrder
from history.worth import MAX_WEIGHT

# A small cluster where warm wins by a clear margin (seed 3; other seeds vary).
SMALL = Scenario(nodes=12, pipelines=30, runs=800, arrival=22.0, seed=3)


def simulate_json(*args):
    out = StringIO()
    call_command("simulate", "--json", *args, stdout=out)
    return orjson.loads(out.getvalue())


def test_same_seed_same_report_and_another_seed_differs():
    first = simulate_json("--nodes", "10", "--runs", "300", "--seed", "7")
    again = simulate_json("--nodes", "10", "--runs", "300", "--seed", "7")
    other = simulate_json("--nodes", "10", "--runs", "300", "--seed", "8")
    assert first == again
    assert first["results"] != other["results"]
    assert [r["strategy"] for r in first["results"]] == [
        "none",
        "seed",
        "warm",
        "adaptive",
        "webhook",
    ]
    assert first["scenario"]["nodes"] == 10 and first["scenario"]["seed"] == 7


def test_warm_beats_seed_and_no_extender_on_a_small_scenario():
    report = run(SMALL)
    results = {r["strategy"]: r for r in report["results"]}
    warm = results["warm"]
    assert warm["exact_rate"] > results["seed"]["exact_rate"]
    assert warm["exact_rate"] > results["none"]["exact_rate"]
    assert warm["busiest_over_mean_load"] <= 1.25
    assert results["seed"]["busiest_over_mean_load"] > warm["busiest_over_mean_load"]
    assert report["warm_wins"] is True
    # Every strategy placed the same pods, and the rates add up.
    assert {r["pods"] for r in report["results"]} == {report["pods"]}
    for r in report["results"]:
        total = r["exact_rate"] + r["partial_rate"] + r["cold_rate"]
        assert total == pytest.approx(1.0, abs=1e-3)


def test_webhook_mode_meets_its_targets_on_a_small_scenario():
    report = run(SMALL, ("none", "warm", "webhook"))
    results = {r["strategy"]: r for r in report["results"]}
    webhook = results["webhook"]
    assert webhook["exact_rate"] > results["none"]["exact_rate"] + 0.3
    assert webhook["exact_rate"] > results["warm"]["exact_rate"] - 0.1
    assert webhook["busiest_over_mean_load"] <= 1.25
    targets = report["webhook_targets"]
    assert targets["met"] is True
    assert targets["exact_over_none"] == pytest.approx(
        webhook["exact_rate"] - results["none"]["exact_rate"], abs=1e-4
    )
    assert "webhook: exact hits +" in format_table(report)
    assert "targets met" in format_table(report)


def test_node_affinity_is_scored_as_kube_scheduler_scores_it():
    """Sum of the matching terms' weights, normalised to 0..100 over the
    candidates with integer division, times the plugin's weight 2."""
    assert node_affinity_scores({"a": 100, "b": 56}, ["a", "b", "c"]) == [100, 56, 0]
    # The best candidate is normalised to 100 even when its weight is low.
    assert node_affinity_scores({"a": 100, "b": 56}, ["b", "c"]) == [100, 0]
    assert node_affinity_scores({"a": 3, "b": 2}, ["a", "b"]) == [100, 66]
    assert node_affinity_scores({}, ["a", "b"]) == [0, 0]
    assert affinity_points({"a": 100, "b": 56}, ["a", "b"]) == [200, 112]
    assert PLUGIN_WEIGHTS["NodeAffinity"] == 2
    assert PLUGIN_WEIGHTS["NodeResourcesFit"] == 1
    assert PLUGIN_WEIGHTS["TaintToleration"] == 3


def admissions(history, workers):
    return WebhookAdmissions(
        history=history,
        rules=WarmRules(),
        workers=workers,
        window=120.0,
        max_nodes=20,
        nodes=[f"n{i}" for i in range(6)],
        pool_days=7.0,
        seed=1,
    )


def test_simulated_webhook_spreads_a_burst_with_one_memory():
    history = MemoryHistory(half_life=3600.0)
    for node in ("n0", "n1", "n2"):
        for _ in range(4):
            history.place(label="ci-app", node=node, now=0.0)
            history.finish(label="ci-app", node=node)
    one = admissions(history, workers=1)
    heaviest = [next(iter(one.admit("ci-app", 100.0))) for _ in range(6)]
    assert heaviest == ["n0", "n1", "n2", "n0", "n1", "n2"]
    # Each warm node now runs two steered pods, twice the mean of the six nodes: the
    # load rule names none of them, the rest of the burst goes to the resource scores.
    assert one.admit("ci-app", 100.0) == {}
    # Each worker remembers only its own reviews: the top node is named first
    # more often.
    three = admissions(history, workers=3)
    heaviest = [next(iter(three.admit("ci-app", 100.0))) for _ in range(6)]
    assert heaviest.count("n0") > 2


def test_the_extender_changes_placements():
    workload = synthetic_workload(SMALL)
    none = simulate(SMALL, workload, "none")
    seed = simulate(SMALL, workload, "seed")
    assert seed["exact_rate"] > none["exact_rate"] + 0.2
    assert seed["time_saved_hours"] > none["time_saved_hours"]


def test_memory_history_mirrors_the_database_rules():
    history = MemoryHistory(half_life=3600.0)
    history.place(label="a-b", node="n1", now=0.0)
    history.place(label="a-b", node="n1", now=3600.0)
    read = history.read(keys=["a", "b"], label="a-b", nodes=["n1", "n2"])
    data = warm_inputs(read, None, ["n1", "n2"], 3600.0, 3600.0)
    assert data["active"] == {"n1": 2} and data["busy"] == {"n1": 2}
    assert dict((k, w) for k, _, w in data["history"]["n1"]) == {"a": 1.5, "b": 1.5}
    history.replace(node="n1", now=4000.0)
    read = history.read(keys=["a", "b"], label="a-b", nodes=["n1"])
    # Rows from before the replacement do not count: nothing is left to weigh.
    assert warm_inputs(read, None, ["n1"], 5000.0, 3600.0)["history"] == {}
    # The seed formula predates node replacement: every row counts.
    assert seed_matches(keys=["a", "b"], rows=read.rows, nodes=["n1"]) == {"n1": (1, 2)}
    history.finish(label="a-b", node="n1")
    history.finish(label="a-b", node="n1")
    assert history.read(keys=["a"], label="a-b", nodes=["n1"]).busy == {}


def test_sampling_scores_a_rotating_share_of_feasible_nodes():
    free = [4.0] * 300
    free[5] = 0.0
    found, start = scored_nodes(free, 1.0, 0, 40)
    assert len(found) == 120 and 5 not in found
    assert start == 121
    found, start = scored_nodes(free, 1.0, 250, 40)
    # The walk wraps around and steps over the full node 5.
    assert found[0] == 250 and found[-1] == (250 + 120) % 300
    everything, _ = scored_nodes(free, 1.0, 0, 100)
    assert len(everything) == 299
    # Small clusters are always scored whole, as upstream.
    assert len(scored_nodes([4.0] * 80, 1.0, 0, 10)[0]) == 80


def test_table_and_options():
    out = StringIO()
    call_command(
        "simulate",
        "--runs",
        "200",
        "--nodes",
        "8",
        "--strategies",
        "seed,warm",
        stdout=out,
    )
    text = out.getvalue()
    assert "scenario default (synthetic" in text
    assert "seed " in text and "warm " in text and "none " not in text
    assert "busiest/mean" in text
    report = run(SMALL, ("warm",))
    assert report["warm_wins"] is None
    assert "warm" in format_table(report)


def test_warm_rules_come_from_options():
    loose = simulate_json(
        "--runs", "300", "--load-penalty", "0", "--strategies", "warm"
    )
    strict = simulate_json("--runs", "300", "--strategies", "warm")
    assert strict["scenario"]["load_penalty"] == WarmRules().load_penalty
    assert loose["results"] != strict["results"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategies", "best"], "unknown strategies"),
        (["--nodes", "0"], "--nodes must be greater than 0"),
        (["--percentage", "101"], "--percentage must be between 1 and 100"),
        (["--fanout-share", "2"], "--fanout-share must be between 0 and 1"),
        (["--shared-names", "-1"], "--shared-names must be between 0 and 1"),
        (["--systems", "-1"], "--systems must not be negative"),
    ],
)
def test_bad_options_are_refused(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("simulate", *args, stdout=StringIO())


def test_documented_scenarios_exist():
    assert {"default", "many-small", "hot-fanout", "shared-names"} <= set(SCENARIOS)


def test_exact_means_this_pipeline_ran_on_the_node():
    """One node: a shared service name is not an exact hit, a shared prefix is a
    partial one, and only the pipeline itself makes the next run exact."""
    labels = [
        "jenkins-java-build-api",
        "gitlab-go-lint-api",
        "jenkins-java-test-api",
        "jenkins-java-build-api",
    ]
    pods = [
        Pod(label=label, cpu=1.0, base=10.0, arrived=100.0 * i)
        for i, label in enumerate(labels)
    ]
    scenario = Scenario(nodes=1, cache_slots=20, replace_every=0)
    result = simulate(scenario, Workload(pods=pods), "none")
    assert result["pods"] == 4
    assert result["exact_rate"] == 0.25
    assert result["partial_rate"] == 0.25
    assert result["cold_rate"] == 0.5


def test_shared_names_labels_share_their_last_segment():
    scenario = SCENARIOS["shared-names"]
    labels = pipeline_labels(scenario)
    assert len(set(labels)) == len(labels) == scenario.pipelines
    assert all(len(label.split("-")) == 4 for label in labels)
    assert 0.3 <= shared_name_share(labels) <= 0.5
    assert shared_name_share(pipeline_labels(SCENARIOS["default"])) == 0.0
    # Another CI system or language, not merely another tool.
    assert shared_name_share(["a-x-t1-api", "a-x-t2-api", "b-x-t1-web"]) == 0.0
    assert shared_name_share(["a-x-t1-api", "b-x-t1-api", "c-y-t-svc"]) == 0.6667


def test_warm_and_webhook_beat_seed_when_service_names_are_shared():
    scenario = with_options(
        SCENARIOS["shared-names"], nodes=12, pipelines=30, runs=800, arrival=22.0
    )
    report = run(scenario)
    assert report["shared_names"] >= 0.3
    results = {r["strategy"]: r for r in report["results"]}
    seed = results["seed"]["exact_rate"]
    assert results["warm"]["exact_rate"] > seed + 0.2
    assert results["webhook"]["exact_rate"] > seed + 0.2


@pytest.mark.django_db
def test_from_db_replays_the_ledger():
    with pytest.raises(CommandError, match="no pipeline pods"):
        call_command("simulate", "--from-db", stdout=StringIO())
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(40):
        Placement.objects.create(
            pod_uid=f"u{i}",
            namespace="ci",
            name=f"p{i}",
            label=f"ci-java-app{i % 3}",
            node=f"node-{i % 4}",
            bound_at=start + timedelta(seconds=30 * i),
            finished_at=start + timedelta(seconds=30 * i + 200),
        )
    report = simulate_json("--from-db")
    assert report["pods"] == 40
    assert report["scenario"]["nodes"] == 4
    assert all(r["pods"] == 40 for r in report["results"])
    assert simulate_json("--from-db", "--nodes", "6")["scenario"]["nodes"] == 6
    lru, learned = simulate_json("--from-db", "--strategies", "lru,lru-learned")[
        "results"
    ]
    assert lru["pods"] == learned["pods"] == 40
    # Fewer ended pods than one reading takes: no depth named yet.
    assert (lru["workspace_depth"], learned["workspace_depth"]) == (LRU_DEPTH, None)


def test_simulated_startup_and_run_by_warmth_follow_the_cost_model():
    report = simulate_json("--runs", "300", "--nodes", "10", "--strategies", "warm")
    [result] = report["results"]
    figures = result["outcomes"]
    runs = {level: figures[level]["runs"] for level in ("exact", "partial", "cold")}
    assert sum(runs.values()) == result["pods"]
    assert runs["exact"] / result["pods"] == pytest.approx(result["exact_rate"], 1e-3)
    # Startup is the model's extra start time; run is the pod's own time.
    assert figures["exact"]["startup_p50"] == 0
    assert figures["partial"]["startup_p90"] == 120
    assert figures["cold"]["startup_p50"] == 300
    pods = synthetic_workload(with_options(SCENARIOS["default"], runs=300, nodes=10))
    assert 0 < figures["exact"]["run_p50"] < max(pod.base for pod in pods.pods)
    text = StringIO()
    call_command("simulate", "--runs", "300", "--strategies", "warm", stdout=text)
    assert "Startup and run by warmth (simulated: cost model)" in text.getvalue()


@pytest.mark.django_db
def test_from_db_shows_measured_beside_simulated_outcomes():
    start = timezone.now() - timedelta(days=90)
    for i in range(6):
        record_placement(
            pod_uid=f"u{i}",
            namespace="ci",
            name=f"p{i}",
            label="ci-java-app",
            node=f"node-{i % 2}",
            bound_at=start + timedelta(minutes=10 * i),
            warmth="exact" if i % 2 else "cold",
        )
        record_outcome(
            pod_uid=f"u{i}", startup=10 + i, run=100 + i, outcome="Succeeded"
        )
    report = simulate_json("--from-db", "--strategies", "warm")
    assert report["measured"]["exact"] == {
        "runs": 3,
        "failed": 0,
        "startup_p50": 13,
        "startup_p90": 15,
        "run_p50": 103,
        "run_p90": 105,
    }
    assert report["measured"]["cold"]["run_p50"] == 102
    # The recorded run times drive the replay: the pods' own times are the runs.
    simulated = report["results"][0]["outcomes"]
    assert sum(simulated[level]["runs"] for level in simulated) == 6
    medians = sorted(
        simulated[level]["run_p50"] for level in simulated if simulated[level]["runs"]
    )
    assert all(100 <= value <= 105 for value in medians)
    text = StringIO()
    call_command("simulate", "--from-db", "--strategies", "warm", stdout=text)
    measured = re.search(r"^measured +exact .*$", text.getvalue(), re.M).group(0)
    assert measured.split() == [
        *("measured", "exact", "3", "0"),
        *("13.0", "15.0", "103.0", "105.0"),
    ]


def test_simulated_times_are_printed_with_one_decimal_each():
    out = StringIO()
    call_command("simulate", "--runs", "300", "--nodes", "8", stdout=out)
    text = out.getvalue()
    table = text[text.index("Startup and run by warmth") :].splitlines()[3:]
    times = [cell for line in table if line.strip() for cell in line.split()[-4:]]
    assert times
    for cell in times:
        assert cell == "-" or re.fullmatch(r"\d+\.\d", cell), (cell, text)


def test_the_worth_scenario_draws_what_warmth_is_worth_per_pipeline():
    scenario = with_options(SCENARIOS["worth"], runs=400)
    labels = pipeline_labels(scenario)
    costs = pipeline_costs(scenario, labels)
    colds = sorted(cold for cold, _ in costs.values())
    lot = [c for c in colds if c >= 60]
    little = [c for c in colds if 0 < c < 60]
    nothing = [c for c in colds if c == 0]
    # 30 % / 40 % / 30 % of 80 pipelines, give or take the draw.
    assert 15 <= len(lot) <= 33 and 22 <= len(little) <= 42 and 15 <= len(nothing)
    assert all(60 <= c <= 180 for c in lot) and all(5 <= c <= 15 for c in little)
    # Pods carry noisy extras; a share hang whatever the node.
    pods = synthetic_workload(scenario).pods
    assert len({round(p.cold_extra, 3) for p in pods if p.cold_extra}) > len(lot)
    assert any(p.startup > 300 for p in pods)
    # The room a workspace takes follows what its pipeline loses cold.
    footprints = {p.label: p.footprint for p in pods}
    assert all(footprints[label] > 1 for label in footprints if costs[label][0] > 60)
    assert all(footprints[label] < 1 for label in footprints if costs[label][0] < 15)
    # Scenarios without a gain mix keep one cost model for every pipeline.
    uniform = pipeline_costs(SCENARIOS["default"], labels)
    assert set(uniform.values()) == {(300.0, 120.0)}


def test_adaptive_learns_each_pipelines_worth_during_the_run():
    scenario = with_options(SCENARIOS["worth"], runs=1200, seed=2)
    report = run(scenario, ("warm", "adaptive"))
    results = {r["strategy"]: r for r in report["results"]}
    bands = results["adaptive"]["weights"]
    # Learned from the simulated outcomes, not read from the scenario: pipelines
    # that gain nothing end off, those that gain a lot pulled harder.
    assert bands["off"] > 0 and bands["stronger"] > 0
    assert results["warm"]["weights"] is None
    assert results["adaptive"]["startup_hours"] > 0


def test_the_oracle_is_told_each_pipelines_worth_by_the_same_rule():
    """`oracle`: adaptive's rule fed the workload's own figures, not learned ones."""
    scenario = with_options(SCENARIOS["worth"], runs=300, seed=4)
    workload = synthetic_workload(scenario)
    truth = TrueWorth(workload)
    labels = sorted(truth.saving, key=truth.saving.get)
    weights = [truth.estimate(label).weight for label in labels]
    # Nothing to gain: off; the most to gain: the strongest pull; in order between.
    assert weights[0] == 0.0 and weights[-1] == MAX_WEIGHT
    assert weights == sorted(weights)
    assert truth.estimate("never-seen").weight == 1.0
    report = run(scenario, ("warm", "oracle"), workload)
    warm, oracle = report["results"]
    assert oracle["strategy"] == "oracle" and oracle["weights"] is None
    assert oracle["time_saved_hours"] != warm["time_saved_hours"]
    table = simulate_json(
        "--scenario", "worth", "--runs", "100", "--strategies", "warm,oracle"
    )
    assert [r["strategy"] for r in table["results"]] == ["warm", "oracle"]


def test_the_cache_oracle_also_knows_which_caches_still_hold_the_workspaces():
    """`oracle-cache`: the oracle's weights, and a node whose cache holds none of the
    pod's workspaces scored cold whatever its history says (issue 32's ceiling)."""
    keys = ["java-*", "java-maven-*", "java-maven-app$"]
    caches = [{"java-maven-app$"}, {"java-*"}, set(), {"go-*"}, set()]
    assert held_only([9, 7, 6, 4, 0], caches, keys) == [9, 7, 1, 1, 0]
    scenario = with_options(SCENARIOS["worth"], runs=300, seed=5)
    report = run(scenario, ("oracle", "oracle-cache"))
    oracle, cached = report["results"]
    assert cached["strategy"] == "oracle-cache" and cached["weights"] is None
    # Knowing what the caches still hold saves more than knowing the worth alone.
    assert cached["time_saved_hours"] > oracle["time_saved_hours"]
    table = simulate_json(
        "--scenario", "worth", "--runs", "100", "--strategies", "oracle-cache"
    )
    assert [r["strategy"] for r in table["results"]] == ["oracle-cache"]


def test_lru_counts_a_workspace_gone_once_enough_other_pipelines_ran_since():
    """`lru`: production's rule (KSSCHED_WORKSPACE_DEPTH) at LRU_DEPTH, on the
    simulator's store: a node scored one above cold for a pipeline once LRU_DEPTH
    other pipelines ran there since it last did (the order the history holds)."""
    assert LRU_DEPTH == 4
    order, history = NodeOrder(), MemoryHistory(half_life=86400.0)
    for label in ("a", "b", "c", "a", "d", "e"):
        order.place("n0", label)
        history.place(label=label, node="n0", now=0.0)
        history.finish(label=label, node="n0")
    history.place(label="b", node="n1", now=0.0)
    history.finish(label="b", node="n1")
    assert order.depth("n0", "a") == 2 and order.depth("n0", "b") == 4
    assert order.depth("n0", "x") is None and order.depth("n1", "a") is None
    lru = WarmStrategy(WarmRules(workspace_depth=LRU_DEPTH), reader=history)
    read = history.read(keys=path_keys("b"), label="b", nodes=None, depths=True)
    assert read.depths == {"n0": 4, "n1": 0}
    # b's workspace on n0 counts as gone; on n1 it is warm; a's is kept on n0.
    gone, kept, cold = lru.score(label="b", nodes=["n0", "n1", "n2"], now=0.0)
    assert (gone, cold) == (2, 1) and kept > gone
    assert lru.score(label="a", nodes=["n0"], now=0.0)[0] > gone
    warm, lru = run(with_options(SCENARIOS["worth"], seed=5), ("warm", "lru"))[
        "results"
    ]
    # Fewer pods sent to nodes whose workspace is long gone.
    assert lru["exact_rate"] > warm["exact_rate"] + 0.05
    assert lru["time_saved_hours"] > warm["time_saved_hours"]


def test_adaptive_stays_with_warm_where_every_pipeline_gains_the_same():
    report = run(SMALL, ("warm", "adaptive"))
    warm, adaptive = report["results"]
    assert adaptive["weights"]["default"] >= 0.8 * sum(adaptive["weights"].values())
    assert abs(adaptive["exact_rate"] - warm["exact_rate"]) <= 0.01
    assert adaptive["time_saved_hours"] >= 0.99 * warm["time_saved_hours"]


@pytest.mark.django_db
def test_from_db_replays_each_pipelines_measured_worth_with_adaptive_weights():
    start = timezone.now() - timedelta(days=2)
    for i in range(40):
        label = "ci-java-lot" if i % 2 else "ci-java-flat"
        warmth = "exact" if i % 4 < 2 else "cold"
        record_placement(
            pod_uid=f"u{i}",
            namespace="ci",
            name=f"p{i}",
            label=label,
            node=f"node-{i % 5}",
            bound_at=start + timedelta(minutes=3 * i),
            warmth=warmth,
        )
        extra = 200 if label == "ci-java-lot" and warmth == "cold" else 0
        record_outcome(
            pod_uid=f"u{i}", startup=10 + extra + i % 3, run=300, outcome="Succeeded"
        )
    costs = measured_costs(SCENARIOS["default"])
    assert costs["ci-java-lot"][0] == pytest.approx(200, abs=3)
    assert costs["ci-java-flat"] == (0.0, 0.0) or costs["ci-java-flat"][0] < 3
    report = simulate_json("--from-db", "--strategies", "warm,adaptive")
    warm, adaptive = report["results"]
    assert warm["weights"] is None
    assert sum(adaptive["weights"].values()) == 2
    # The replayed pods carry the measured costs, not the scenario's 300 s.
    assert warm["time_saved_hours"] < 40 * 300 / 3600


def test_lru_learned_reads_the_depth_from_the_outcomes_so_far():
    """`lru-learned`: no node demoted until the run's own outcomes name a depth (as
    `outcomes --workspaces` names it); then `lru` at that depth."""
    recency = Recency(learned=True)
    assert recency.depth is None  # nothing learned: no node demoted
    rng = random.Random(7)
    cache: OrderedDict[str, None] = OrderedDict()  # n0 keeps two workspaces
    for _ in range(READ_EVERY):
        key = f"p{rng.randrange(8)}$"
        level = "exact" if key in cache else "cold"
        startup = 10.0 if level == "exact" else 60.0
        recency.finished(recency.placed("n0", key, 0.0, level, startup, 100.0))
        cache[key] = None
        cache.move_to_end(key)
        if len(cache) > 2:
            cache.popitem(last=False)
    assert recency.depth == 2
    recency.order.place("n0", "a$")
    recency.order.forget("n0")  # the node replaced
    assert recency.order.depth("n0", "a$") is None
    assert Recency(learned=False).depth == LRU_DEPTH
    warm, learned = run(
        with_options(SCENARIOS["worth"], seed=5), ("warm", "lru-learned")
    )["results"]
    assert learned["workspace_depth"] is not None and warm["workspace_depth"] is None
    assert learned["exact_rate"] > warm["exact_rate"] + 0.05
    assert learned["time_saved_hours"] > warm["time_saved_hours"]
