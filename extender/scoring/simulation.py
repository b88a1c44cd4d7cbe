"""A cluster simulator that runs the real scoring code over a synthetic workload.

The model, in brief:

* N nodes, each with `cpu` cores and an LRU cache of `cache_slots` workspaces. A
  workspace is one step of a label's path (`labels.path_keys`): what pipelines
  under `java-*` or `java-javamaven-*` share (toolchains, images, dependency
  caches), and the pipeline's own (`java-javamaven-p17$`). A pod whose own
  workspace is cached starts on an exact hit, one with only a shared prefix cached
  on a partial hit, otherwise cold: the ledger's definition of warmth. Starting
  touches every step, so a busy node evicts what it has not used for a while, as
  real build caches do.
* P pipelines with Zipf popularity and labels `<language>-<tool>-<pipeline>`, or
  `<ci-system>-<language>-<tool>-<service>` with service names partly drawn from a
  small shared vocabulary (`scenarios.named_labels`). Runs
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
* "webhook" models webhook mode: no extender; every pod of a burst is admitted by
  the webhook (`admissions.WebhookAdmissions`, the real steering code and
  `warm` scores) before any is scheduled, and the default profile adds
  NodeAffinity x 2 for the preferred terms (`default_profile` says where that
  model comes from).

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
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from extender.scoring.admissions import WebhookAdmissions
from extender.scoring.default_profile import affinity_points, scored_nodes
from extender.scoring.rules import WarmRules
from extender.scoring.scenarios import (
    Pod,
    Scenario,
    Workload,
    shared_name_share,
    synthetic_workload,
)
from extender.scoring.strategies import SeedStrategy, WarmStrategy
from extender.scoring.whatif import Recency, TrueWorth, held_only
from history.labels import path_keys
from history.outcomes import WARMTHS, format_sections, summarize
from history.reader.memory import MemoryHistory
from history.worth import WorthBook

__all__ = [
    "EXTRA_STRATEGIES",
    "STRATEGY_NAMES",
    "format_table",
    "run",
    "simulate",
    "with_options",
]

STRATEGY_NAMES = ("none", "seed", "warm", "adaptive", "webhook")
# On request only (`whatif`): `oracle`, `adaptive` told every pipeline's worth, the
# ceiling of what learning can add; `oracle-cache`, also told which caches still
# hold the pod's workspaces; `lru`, `warm` with KSSCHED_WORKSPACE_DEPTH at
# LRU_DEPTH (each node's own workspace counted gone once that many other pipelines
# ran there since); `lru-learned`, the same with the depth read from the run's own
# outcomes.
EXTRA_STRATEGIES = ("oracle", "oracle-cache", "lru", "lru-learned")
# The strategies that learn what warmth is worth to each pipeline (`history.worth`)
# from the outcomes of the pods they placed, as the extender and the webhook do
# with KSSCHED_WORTH=auto; `warm` is the same scoring with weight 1 throughout.
LEARNING = ("adaptive", "webhook")


def simulate(scenario: Scenario, workload: Workload, strategy: str) -> dict[str, Any]:
    """Place every pod of `workload` with `strategy`; return the measured figures."""
    rng = random.Random(scenario.seed + 104729)
    names = [f"node-{i:04d}" for i in range(scenario.nodes)]
    free = [scenario.cpu] * scenario.nodes
    running = [0] * scenario.nodes
    # Each node's cache: workspace -> the room it takes, least recently used first.
    caches: list[OrderedDict[str, float]] = [OrderedDict() for _ in names]
    used = [0.0] * scenario.nodes
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
    # (outcome, startup, run) per warmth, as the ledger records them: the cost
    # model's extra start time is the startup, the pod's own time the run.
    timings: dict[str, list[tuple[str, float, float]]] = {
        level: [] for level in WARMTHS
    }
    concurrency: list[int] = []
    waits: list[float] = []
    saved = 0.0
    startups = 0.0
    next_start = 0
    book = WorthBook() if strategy in LEARNING else None
    recency = Recency(learned=strategy == "lru-learned")

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
    admissions: WebhookAdmissions | None = None
    if strategy == "seed":
        scorer = SeedStrategy(reader=history)
    elif strategy in ("warm", "adaptive", *EXTRA_STRATEGIES):
        worth = TrueWorth(workload) if strategy.startswith("oracle") else book
        scorer = WarmStrategy(
            rules=rules, reader=history, half_life=history.half_life, worth=worth
        )
    elif strategy == "webhook":
        admissions = WebhookAdmissions(
            history=history,
            rules=rules,
            workers=scenario.webhook_workers,
            window=scenario.webhook_memory,
            max_nodes=scenario.webhook_max_nodes,
            nodes=names,
            pool_days=scenario.webhook_pool_days,
            seed=scenario.seed,
            worth=book,
        )
    # Webhook mode: the terms each pending pod was admitted with, by id(pod).
    terms: dict[int, dict[str, int]] = {}

    def extra_points(pod: Pod, scored: list[int], now: float) -> list[int]:
        """What kube-scheduler adds to least-allocated: the extender's score x
        weight x 10, or NodeAffinity's for the webhook's terms."""
        candidates = [names[i] for i in scored]
        if admissions is not None:
            return affinity_points(terms.pop(id(pod)), candidates)
        if scorer is None:
            return [0] * len(candidates)
        weight = scenario.weight * 10
        if isinstance(scorer, WarmStrategy) and strategy in ("lru", "lru-learned"):
            # Production's rule (KSSCHED_WORKSPACE_DEPTH) at the run's depth.
            scorer.rules = replace(rules, workspace_depth=recency.depth or 0)
        scores = scorer.score(label=pod.label, nodes=candidates, now=now)
        if strategy == "oracle-cache":
            held = [caches[i] for i in scored]
            scores = held_only(scores, held, path_keys(pod.label))
        return [score * weight for score in scores]

    def try_place(pod: Pod, now: float) -> bool:
        nonlocal next_start, sequence, saved, startups
        scored, after = scored_nodes(free, pod.cpu, next_start, scenario.percentage)
        if not scored:
            return False
        next_start = after
        added = extra_points(pod, scored, now)
        best, best_total = [], -1.0
        for i, points in zip(scored, added, strict=True):
            least_allocated = (free[i] - pod.cpu) / scenario.cpu * 100
            total = points + int(least_allocated)
            if total > best_total:
                best, best_total = [i], total
            elif total == best_total:
                best.append(i)
        chosen = best[0] if len(best) == 1 else rng.choice(best)
        cache = caches[chosen]
        workspaces = path_keys(pod.label)
        if workspaces[-1] in cache:
            level, extra = "exact", 0.0
        elif any(key in cache for key in workspaces[:-1]):
            level, extra = "partial", pod.partial_extra
        else:
            level, extra = "cold", pod.cold_extra
        warmth[level] += 1
        startup = pod.startup + extra
        timings[level].append(("Succeeded", startup, pod.base))
        saved += pod.cold_extra - extra
        startups += startup
        for key in workspaces:
            # A shared prefix (a toolchain) holds what the biggest pipeline under
            # it left there; the pipeline's own workspace its own footprint.
            own = key == workspaces[-1]
            size = pod.footprint if own else max(pod.footprint, cache.get(key, 0.0))
            used[chosen] += size - cache.get(key, 0.0)
            cache[key] = size
            cache.move_to_end(key)
        # Evict the least recently used until the cache fits (never the newest).
        while used[chosen] > scenario.cache_slots + 1e-9 and len(cache) > 1:
            used[chosen] -= cache.popitem(last=False)[1]
        free[chosen] -= pod.cpu
        running[chosen] += 1
        concurrency.append(running[chosen])
        duration = pod.base + extra
        load[chosen] += pod.cpu * duration
        waits.append(now - pod.arrived)
        history.place(label=pod.label, node=names[chosen], now=now)
        row = recency.placed(
            names[chosen], workspaces[-1], now, level, startup, pod.base
        )
        if admissions is not None:
            admissions.placed(pod.label, now)
        finish = (pod, chosen, level, startup, row)
        heapq.heappush(events, (now + duration, sequence, "finish", finish))
        sequence += 1
        return True

    end = 0.0
    while events:
        now, _, kind, payload = heapq.heappop(events)
        end = now
        if kind == "arrive":
            pending.append(payload)
            if admissions is not None:
                # A burst is admitted whole before the scheduler sees any of it.
                terms[id(payload)] = admissions.admit(payload.label, now)
                while events and events[0][0] == now and events[0][2] == "arrive":
                    pod = heapq.heappop(events)[3]
                    pending.append(pod)
                    terms[id(pod)] = admissions.admit(pod.label, now)
        elif kind == "finish":
            pod, node, level, startup, row = payload
            recency.finished(row)
            free[node] += pod.cpu
            running[node] -= 1
            history.finish(label=pod.label, node=names[node])
            if book is not None:
                # The watcher records the outcome when the pod ends.
                book.add(pod.label, level, startup, pod.base)
        else:
            caches[payload].clear()
            used[payload] = 0.0
            history.replace(node=names[payload], now=now)
            recency.order.forget(names[payload])
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
        "outcomes": {level: summarize(timings[level]) for level in WARMTHS},
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
        "startup_hours": round(startups / 3600, 1),
        "weights": book.bands() if book is not None else None,
        "mean_wait_seconds": round(sum(waits) / len(waits), 1) if waits else 0.0,
        # `lru` and `lru-learned`: the depth from which workspaces count as gone.
        "workspace_depth": recency.depth if strategy.startswith("lru") else None,
    }


def _percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return 0
    return values[min(len(values) - 1, int(math.ceil(fraction * len(values))) - 1)]


def run(
    scenario: Scenario,
    strategies: tuple[str, ...] = STRATEGY_NAMES,
    workload: Workload | None = None,
) -> dict[str, Any]:
    """Simulate `scenario` once per strategy over the same workload.

    Returns {"scenario": parameters, "pods": n, "shared_names": the share of the
    pipelines whose last segment another CI system's or language's pipeline also
    ends with, "results": [figures per strategy],
    "warm_wins": bool or None, "webhook_targets": dict or None}. `warm_wins` says
    whether `warm` beat the other extender strategies and no extender on exact-hit
    rate with its busiest node at most 1.25x the mean load; `webhook_targets`
    checks webhook mode against `none` and `warm` (see `webhook_targets`).
    """
    workload = workload or synthetic_workload(scenario)
    results = [simulate(scenario, workload, name) for name in strategies]
    by_name = {result["strategy"]: result for result in results}
    wins = None
    others = [
        r
        for name, r in by_name.items()
        if name not in ("warm", "adaptive", "webhook", *EXTRA_STRATEGIES)
    ]
    if "warm" in by_name and others:
        warm = by_name["warm"]
        wins = warm["busiest_over_mean_load"] <= BALANCED and all(
            warm["exact_rate"] > other["exact_rate"] for other in others
        )
    targets = None
    if {"none", "warm", "webhook"} <= by_name.keys():
        targets = webhook_targets(
            none=by_name["none"], warm=by_name["warm"], webhook=by_name["webhook"]
        )
    return {
        "scenario": asdict(scenario),
        "pods": len(workload.pods),
        "node_replacements": len(workload.replacements),
        "shared_names": shared_name_share(sorted({pod.label for pod in workload.pods})),
        "results": results,
        "warm_wins": wins,
        "webhook_targets": targets,
    }


# The targets webhook mode is held to: exact hits well above no extender and close
# to `warm`; a busiest node no more loaded than `warm`'s (give or take a few
# hundredths) and within BALANCED wherever `warm` is.
BALANCED = 1.25
WIDE_MARGIN = 0.20
CLOSE_TO_WARM = 0.10
LOAD_TOLERANCE = 0.05


def webhook_targets(
    *, none: dict[str, Any], warm: dict[str, Any], webhook: dict[str, Any]
) -> dict[str, Any]:
    """Webhook mode against its targets: the margins and whether each is met."""
    load, warm_load = (
        webhook["busiest_over_mean_load"],
        warm["busiest_over_mean_load"],
    )
    checks = {
        "beats_none": webhook["exact_rate"] - none["exact_rate"] >= WIDE_MARGIN,
        "close_to_warm": warm["exact_rate"] - webhook["exact_rate"] <= CLOSE_TO_WARM,
        "load_like_warm": load <= warm_load + LOAD_TOLERANCE,
        "balanced_where_warm_is": warm_load > BALANCED or load <= BALANCED,
    }
    return {
        "exact_over_none": round(webhook["exact_rate"] - none["exact_rate"], 4),
        "exact_under_warm": round(warm["exact_rate"] - webhook["exact_rate"], 4),
        "busiest_over_warm": round(load - warm_load, 3),
        **checks,
        "met": all(checks.values()),
    }


def with_options(scenario: Scenario, **options: Any) -> Scenario:
    """`scenario` with the given parameters overridden (None means keep)."""
    return replace(scenario, **{k: v for k, v in options.items() if v is not None})


def format_table(report: dict[str, Any]) -> str:
    """A readable table of `run`'s report."""
    header = (
        f"{'strategy':<8} {'pods':>6} {'exact':>7} {'partial':>8} {'cold':>7} "
        f"{'busiest/mean':>13} {'p95 pods/node':>14} {'saved h':>8} "
        f"{'startup h':>9} {'wait s':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in report["results"]:
        lines.append(
            f"{r['strategy']:<8} {r['pods']:>6} {r['exact_rate']:>7.1%} "
            f"{r['partial_rate']:>8.1%} {r['cold_rate']:>7.1%} "
            f"{r['busiest_over_mean_load']:>13.2f} {r['p95_pods_per_node']:>14} "
            f"{r['time_saved_hours']:>8.1f} {r['startup_hours']:>9.1f} "
            f"{r['mean_wait_seconds']:>7.1f}"
        )
    if report["warm_wins"] is not None:
        verdict = "yes" if report["warm_wins"] else "no"
        lines.append(
            f"warm beats the others on exact hits with busiest <= 1.25x mean: {verdict}"
        )
    targets = report.get("webhook_targets")
    if targets is not None:
        missed = [
            name
            for name in (
                "beats_none",
                "close_to_warm",
                "load_like_warm",
                "balanced_where_warm_is",
            )
            if not targets[name]
        ]
        lines.append(
            f"webhook: exact hits {targets['exact_over_none']:+.1%} over none, "
            f"{-targets['exact_under_warm']:+.1%} over warm, busiest/mean "
            f"{targets['busiest_over_warm']:+.2f} over warm; targets "
            + ("met" if not missed else "missed: " + ", ".join(missed))
        )
    return "\n".join(lines + ["", format_outcomes(report)])


def format_outcomes(report: dict[str, Any]) -> str:
    """Startup and run by warmth per strategy, as `manage.py outcomes` prints them;
    beside them the ledger's measured figures when the report has them."""
    sections = [(r["strategy"], r["outcomes"]) for r in report["results"]]
    if report.get("measured"):
        sections.append(("measured", report["measured"]))
    title = "Startup and run by warmth (simulated: cost model)"
    # One decimal for every time: the columns line up (451.2, 1532.1).
    return "\n".join([title, *format_sections(sections, "source", decimals=1)])
