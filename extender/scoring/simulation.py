"""A cluster simulator that runs the real scoring code over a synthetic workload.

The model, in brief:

* N nodes, each with `cpu` cores and an LRU cache of `cache_slots` workspaces. A
  workspace is one label segment (`java`, `java1`, `p17`): a pod whose most specific
  segment is cached starts on an exact hit, one with only a more general segment
  cached on a partial hit, otherwise cold. Starting touches every segment, so a
  busy node evicts what it has not used for a while, as real build caches do.
* P pipelines with Zipf popularity and labels `<language>-<tool>-<pipeline>`. Runs
  arrive as a Poisson process; a run is a fan-out burst of 1..`fanout` pods (with
  probability `fanout_share`, else one pod). A pod runs `base` seconds (exponential
  around `run_time`) plus `cold_extra` when cold or `partial_extra` on a partial hit:
  the stated cold-vs-warm cost model.
* Now and then a node is replaced: same name, new machine, empty cache.
* Scheduling as kube-scheduler does it: the nodes with room for the pod are
  feasible; with `percentage` below 100 only a rotating sample of them is scored
  (`percentageOfNodesToScore`, at least 100 nodes, as upstream); each scored node
  gets `extender score x weight x 10` plus a least-allocated score 0..100
  (NodeResourcesFit, weight 1) and the best wins, ties broken at random. A pod that
  fits nowhere waits in a FIFO queue until a pod finishes.

The strategies are the real ones (`extender.scoring.strategies`), reading from an
in-memory store kept exactly as the database keeps it
(`history.reader.memory.MemoryHistory` mirrors the ledger's upsert; node
replacements count as they do for the database). "none" models kube-scheduler
without the extender.

Everything is deterministic for a given seed: the workload is drawn first from one
random stream, and every strategy replays it with its own identically seeded
tie-breaker.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from extender.scoring.rules import WarmRules
from extender.scoring.strategies import SeedStrategy, WarmStrategy
from history.labels import split_pipeline_label
from history.models import Placement
from history.reader.memory import MemoryHistory

STRATEGY_NAMES = ("none", "seed", "warm")
LANGUAGES = ("java", "go", "py", "node", "rust", "ruby", "dotnet", "cpp")
# kube-scheduler's minFeasibleNodesToFind: sampling never scores fewer nodes.
MIN_FEASIBLE_NODES = 100


@dataclass(frozen=True)
class Scenario:
    """Every parameter of a simulation run (all are `manage.py simulate` options)."""

    nodes: int = 30
    cpu: float = 16.0
    cache_slots: int = 8
    pipelines: int = 80
    languages: int = 4
    tools: int = 3
    zipf: float = 1.1
    runs: int = 2500
    arrival: float = 10.0
    fanout: int = 6
    fanout_share: float = 0.3
    pod_cpu: float = 2.0
    run_time: float = 600.0
    cold_extra: float = 300.0
    partial_extra: float = 120.0
    replace_every: float = 6 * 3600.0
    weight: int = 5
    percentage: int = 100
    # Caches here turn over in about a quarter of an hour (8 slots, a pod every few
    # minutes per node), so a placement's weight halves every 7.2 minutes. In a
    # cluster, set KSSCHED_HALF_LIFE_DAYS to about half the time a workspace
    # survives in a node's cache.
    half_life_days: float = 0.005
    saturation: float = WarmRules.saturation
    hotspot_penalty: int = WarmRules.hotspot_penalty
    min_weight: float = WarmRules.min_weight
    load_penalty: float = WarmRules.load_penalty
    load_slack: float = WarmRules.load_slack
    seed: int = 1


SCENARIOS = {
    "default": Scenario(),
    # Many pipelines, each run rarely and with little fan-out: caches churn.
    "many-small": Scenario(
        pipelines=400,
        languages=6,
        tools=4,
        fanout=2,
        fanout_share=0.1,
        zipf=0.8,
        arrival=7.0,
    ),
    # A few hot pipelines with wide fan-out bursts: the hotspot case.
    "hot-fanout": Scenario(
        pipelines=12, zipf=1.3, fanout=16, fanout_share=0.6, runs=1000, arrival=30.0
    ),
    # Frequent node replacement: history about gone machines must be dropped.
    "churn": Scenario(replace_every=1800.0),
    # A large cluster where kube-scheduler scores only a sample of the nodes.
    "sampled": Scenario(
        nodes=300, pipelines=600, runs=6000, arrival=1.0, percentage=40
    ),
}


@dataclass
class Pod:
    label: str
    keys: list[str]
    cpu: float
    base: float
    arrived: float


@dataclass
class Workload:
    """The pods to place, in arrival order, and when which node is replaced."""

    pods: list[Pod]
    replacements: list[tuple[float, int]] = field(default_factory=list)


def pipeline_labels(scenario: Scenario) -> list[str]:
    """`<language>-<language><tool>-p<n>` for each pipeline, in popularity order."""
    rng = random.Random(scenario.seed * 7919 + 1)
    languages = [LANGUAGES[i % len(LANGUAGES)] for i in range(scenario.languages)]
    labels = []
    for index in range(scenario.pipelines):
        language = rng.randrange(len(languages))
        tool = rng.randrange(scenario.tools)
        name = languages[language] + (str(language) if language >= 8 else "")
        labels.append(f"{name}-{name}{tool}-p{index}")
    return labels


def synthetic_workload(scenario: Scenario) -> Workload:
    """Draw the workload of `scenario` from its seed."""
    rng = random.Random(scenario.seed)
    labels = pipeline_labels(scenario)
    popularity = [1 / (rank + 1) ** scenario.zipf for rank in range(len(labels))]
    cumulative = []
    total = 0.0
    for weight in popularity:
        total += weight
        cumulative.append(total)
    pods = []
    now = 0.0
    for _ in range(scenario.runs):
        now += rng.expovariate(1 / scenario.arrival)
        label = rng.choices(labels, cum_weights=cumulative)[0]
        size = 1
        if scenario.fanout > 1 and rng.random() < scenario.fanout_share:
            size = rng.randint(2, scenario.fanout)
        for _ in range(size):
            pods.append(
                Pod(
                    label=label,
                    keys=label.split("-"),
                    cpu=scenario.pod_cpu,
                    base=rng.expovariate(1 / scenario.run_time),
                    arrived=now,
                )
            )
    replacements = []
    if scenario.replace_every > 0:
        at = 0.0
        while True:
            at += rng.expovariate(1 / scenario.replace_every)
            if at >= now:
                break
            replacements.append((at, rng.randrange(scenario.nodes)))
    return Workload(pods=pods, replacements=replacements)


def ledger_workload(scenario: Scenario) -> tuple[Workload, int]:
    """The recorded placements as a workload, and how many nodes they used.

    Pods arrive when they were bound and run as long as they ran (`run_time` when
    still running); the recorded time is taken as the warm run time. Node
    replacements are not replayed. Pods without pipeline segments are skipped.
    """
    pods = []
    nodes = set()
    start = None
    rows = Placement.objects.order_by("bound_at", "pk").values_list(
        "label", "node", "bound_at", "finished_at"
    )
    for label, node, bound_at, finished_at in rows.iterator():
        keys = split_pipeline_label(label)
        if not keys:
            continue
        start = start if start is not None else bound_at
        nodes.add(node)
        ran = (finished_at - bound_at).total_seconds() if finished_at else None
        pods.append(
            Pod(
                label="-".join(keys),
                keys=keys,
                cpu=scenario.pod_cpu,
                base=ran if ran is not None and ran >= 0 else scenario.run_time,
                arrived=(bound_at - start).total_seconds(),
            )
        )
    return Workload(pods=pods), len(nodes)


def scored_nodes(
    free: list[float], cpu: float, start: int, percentage: int
) -> tuple[list[int], int]:
    """The nodes kube-scheduler scores for a pod needing `cpu`, and the next start.

    Like upstream: walk the nodes round-robin from `start`, keep those with room,
    stop once `max(100, n * percentage / 100)` are found (all of them at 100 % or
    with at most 100 nodes), and let the next pod start where this walk ended.
    """
    total = len(free)
    wanted = total
    if percentage < 100 and total > MIN_FEASIBLE_NODES:
        wanted = max(MIN_FEASIBLE_NODES, total * percentage // 100)
    found: list[int] = []
    examined = 0
    for step in range(total):
        node = (start + step) % total
        examined += 1
        if free[node] >= cpu:
            found.append(node)
            if len(found) >= wanted:
                break
    return found, (start + examined) % total


def simulate(scenario: Scenario, workload: Workload, strategy: str) -> dict:
    """Place every pod of `workload` with `strategy`; return the measured figures."""
    rng = random.Random(scenario.seed + 104729)
    names = [f"node-{i:04d}" for i in range(scenario.nodes)]
    free = [scenario.cpu] * scenario.nodes
    running = [0] * scenario.nodes
    caches: list[OrderedDict[str, None]] = [OrderedDict() for _ in names]
    load = [0.0] * scenario.nodes
    history = MemoryHistory(scenario.half_life_days * 86400.0)
    rules = WarmRules(
        saturation=scenario.saturation,
        hotspot_penalty=scenario.hotspot_penalty,
        min_weight=scenario.min_weight,
        load_penalty=scenario.load_penalty,
        load_slack=scenario.load_slack,
    )
    warmth = {"exact": 0, "partial": 0, "cold": 0}
    concurrency: list[int] = []
    waits: list[float] = []
    saved = 0.0
    next_start = 0

    events: list[tuple[float, int, str, Any]] = []
    sequence = 0
    for pod in workload.pods:
        events.append((pod.arrived, sequence, "arrive", pod))
        sequence += 1
    for at, node in workload.replacements:
        events.append((at, sequence, "replace", node))
        sequence += 1
    heapq.heapify(events)
    pending: list[Pod] = []

    scorer: SeedStrategy | WarmStrategy | None = None
    if strategy == "seed":
        scorer = SeedStrategy(reader=history)
    elif strategy == "warm":
        scorer = WarmStrategy(rules=rules, reader=history, half_life=history.half_life)

    def extender_scores(pod: Pod, candidates: list[str], now: float) -> list[int]:
        if scorer is None:
            return [0] * len(candidates)
        return scorer.score(label=pod.label, nodes=candidates, now=now)

    def try_place(pod: Pod, now: float) -> bool:
        nonlocal next_start, sequence, saved
        scored, after = scored_nodes(free, pod.cpu, next_start, scenario.percentage)
        if not scored:
            return False
        next_start = after
        candidates = [names[i] for i in scored]
        extender = extender_scores(pod, candidates, now)
        best, best_total = [], -1.0
        for i, score in zip(scored, extender, strict=True):
            least_allocated = (free[i] - pod.cpu) / scenario.cpu * 100
            total = score * scenario.weight * 10 + int(least_allocated)
            if total > best_total:
                best, best_total = [i], total
            elif total == best_total:
                best.append(i)
        chosen = best[0] if len(best) == 1 else rng.choice(best)
        cache = caches[chosen]
        if pod.keys[-1] in cache:
            level, extra = "exact", 0.0
        elif any(key in cache for key in pod.keys[:-1]):
            level, extra = "partial", scenario.partial_extra
        else:
            level, extra = "cold", scenario.cold_extra
        warmth[level] += 1
        saved += scenario.cold_extra - extra
        for key in pod.keys:
            cache[key] = None
            cache.move_to_end(key)
        while len(cache) > scenario.cache_slots:
            cache.popitem(last=False)
        free[chosen] -= pod.cpu
        running[chosen] += 1
        concurrency.append(running[chosen])
        duration = pod.base + extra
        load[chosen] += pod.cpu * duration
        waits.append(now - pod.arrived)
        history.place(keys=pod.keys, label=pod.label, node=names[chosen], now=now)
        heapq.heappush(events, (now + duration, sequence, "finish", (pod, chosen)))
        sequence += 1
        return True

    end = 0.0
    while events:
        now, _, kind, payload = heapq.heappop(events)
        end = now
        if kind == "arrive":
            pending.append(payload)
        elif kind == "finish":
            pod, node = payload
            free[node] += pod.cpu
            running[node] -= 1
            history.finish(label=pod.label, node=names[node])
        else:
            caches[payload].clear()
            history.replace(node=names[payload], now=now)
            continue
        # FIFO: the head of the queue waits until it fits (no overtaking).
        while pending and try_place(pending[0], now):
            pending.pop(0)

    placed = sum(warmth.values())
    mean_load = sum(load) / len(load) if load else 0.0
    concurrency.sort()
    waits.sort()
    return {
        "strategy": strategy,
        "pods": placed,
        "exact_rate": round(warmth["exact"] / placed, 4) if placed else 0.0,
        "partial_rate": round(warmth["partial"] / placed, 4) if placed else 0.0,
        "cold_rate": round(warmth["cold"] / placed, 4) if placed else 0.0,
        "busiest_over_mean_load": round(max(load) / mean_load, 3) if mean_load else 0,
        "utilization": round(sum(load) / (scenario.nodes * scenario.cpu * end), 3)
        if end
        else 0.0,
        "p95_pods_per_node": _percentile(concurrency, 0.95),
        "time_saved_hours": round(saved / 3600, 1),
        "mean_wait_seconds": round(sum(waits) / len(waits), 1) if waits else 0.0,
    }


def _percentile(values: list, fraction: float):
    if not values:
        return 0
    return values[min(len(values) - 1, int(math.ceil(fraction * len(values))) - 1)]


def run(
    scenario: Scenario,
    strategies: tuple[str, ...] = STRATEGY_NAMES,
    workload: Workload | None = None,
) -> dict:
    """Simulate `scenario` once per strategy over the same workload.

    Returns {"scenario": parameters, "pods": n, "results": [figures per strategy],
    "warm_wins": bool or None}. `warm_wins` says whether `warm` beat every other
    strategy on exact-hit rate with its busiest node at most 1.25x the mean load.
    """
    workload = workload or synthetic_workload(scenario)
    results = [simulate(scenario, workload, name) for name in strategies]
    by_name = {result["strategy"]: result for result in results}
    wins = None
    if "warm" in by_name and len(by_name) > 1:
        warm = by_name["warm"]
        wins = warm["busiest_over_mean_load"] <= 1.25 and all(
            warm["exact_rate"] > other["exact_rate"]
            for name, other in by_name.items()
            if name != "warm"
        )
    return {
        "scenario": asdict(scenario),
        "pods": len(workload.pods),
        "node_replacements": len(workload.replacements),
        "results": results,
        "warm_wins": wins,
    }


def with_options(scenario: Scenario, **options) -> Scenario:
    """`scenario` with the given parameters overridden (None means keep)."""
    return replace(scenario, **{k: v for k, v in options.items() if v is not None})


def format_table(report: dict) -> str:
    """A readable table of `run`'s report."""
    header = (
        f"{'strategy':<8} {'pods':>6} {'exact':>7} {'partial':>8} {'cold':>7} "
        f"{'busiest/mean':>13} {'p95 pods/node':>14} {'saved h':>8} {'wait s':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in report["results"]:
        lines.append(
            f"{r['strategy']:<8} {r['pods']:>6} {r['exact_rate']:>7.1%} "
            f"{r['partial_rate']:>8.1%} {r['cold_rate']:>7.1%} "
            f"{r['busiest_over_mean_load']:>13.2f} {r['p95_pods_per_node']:>14} "
            f"{r['time_saved_hours']:>8.1f} {r['mean_wait_seconds']:>7.1f}"
        )
    if report["warm_wins"] is not None:
        verdict = "yes" if report["warm_wins"] else "no"
        lines.append(
            f"warm beats the others on exact hits with busiest <= 1.25x mean: {verdict}"
        )
    return "\n".join(lines)
