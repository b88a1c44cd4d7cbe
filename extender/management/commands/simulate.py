"""`manage.py simulate`: compare scoring strategies on a simulated cluster.

Runs `extender.scoring.simulation` (the real scoring code over a synthetic workload,
or over the recorded ledger with --from-db) and prints a table per scenario, or JSON.
With --from-db the measured startup and run medians by warmth (`history.outcomes`,
whole ledger) are reported as `measured` beside the simulated ones.
"""

import dataclasses
from typing import Any

import orjson
from django.core.management.base import BaseCommand, CommandError, CommandParser

from extender.scoring.scenarios import SCENARIOS, Scenario, ledger_workload
from extender.scoring.simulation import (
    EXTRA_STRATEGIES,
    STRATEGY_NAMES,
    format_table,
    run,
    with_options,
)
from extender.scoring.whatif import LRU_DEPTH
from history.models import Placement
from history.outcomes import outcome_report

HELP = {
    "nodes": "number of nodes",
    "cpu": "CPU cores per node",
    "cache_slots": "workspaces each node's LRU cache holds",
    "pipelines": "number of pipelines",
    "languages": "distinct first segments (languages)",
    "tools": "tools per language (second segments)",
    "systems": "CI systems: labels <ci-system>-<language>-<tool>-<service> "
    "(0: <language>-<language><tool>-p<n>)",
    "shared_names": "with --systems: share of services named from a small "
    "shared vocabulary (api, web, worker, ...)",
    "zipf": "Zipf exponent of pipeline popularity",
    "runs": "pipeline runs to simulate",
    "arrival": "mean seconds between runs",
    "fanout": "largest fan-out burst (pods per run)",
    "fanout_share": "share of runs that fan out",
    "pod_cpu": "CPU cores each pod requests",
    "run_time": "mean warm run time in seconds",
    "cold_extra": "seconds a cold start adds",
    "partial_extra": "seconds a partial hit adds",
    "replace_every": "mean seconds between node replacements (0: never)",
    "gain_lot": "share of pipelines whose cold start adds 60-180 s (with "
    "--gain-little; both 0: every pipeline adds --cold-extra)",
    "gain_little": "share of pipelines whose cold start adds 5-15 s (the rest: 0)",
    "startup_noise": "log-normal sigma of each pod's startup and extras (0: none)",
    "hung_share": "share of pods whose startup hangs 300-900 s on any node",
    "weight": "extender weight in the scheduler configuration",
    "percentage": "percentageOfNodesToScore (100: score every feasible node)",
    "half_life_days": "recency half-life of the warm strategy, in days",
    "saturation": "warm: weight at which a node is halfway up its band",
    "hotspot_penalty": "warm: points off per active pod of the same label",
    "min_weight": "warm: weight below which a segment counts as forgotten",
    "load_penalty": "warm: points off per active pod above the mean",
    "load_slack": "warm: share above the mean load a node may run unpenalised",
    "webhook_max_nodes": "webhook: most nodes named in one pod's preferred terms",
    "webhook_memory": "webhook: seconds a steered pod counts as running",
    "webhook_workers": "webhook: gunicorn workers, each with its own steering memory",
    "webhook_pool_days": "webhook: days a node stays in the pipeline pool",
    "seed": "random seed (same seed, same result)",
}


def measured_outcomes() -> dict[str, Any]:
    """The ledger's startup and run figures by warmth, over all recorded history."""
    first = Placement.objects.order_by("bound_at").values_list("bound_at", flat=True)
    since = first.first()
    return outcome_report(since=since)["overall"] if since else {}


class Command(BaseCommand):
    help = (
        "Simulate a cluster and compare the scoring strategies (no extender, seed, "
        "warm, warm weighted by what warmth is worth to each pipeline, and that "
        "through the admission webhook) on cache hits, load balance and time saved."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--scenario",
            default="default",
            choices=[*SCENARIOS, "all"],
            help="a documented scenario to start from, or all of them",
        )
        parser.add_argument(
            "--strategies",
            default=",".join(STRATEGY_NAMES),
            help=f"comma-separated, from {', '.join(STRATEGY_NAMES)}; also "
            "oracle: adaptive told each pipeline's worth, the ceiling of learning; "
            "oracle-cache: also told which nodes' caches still hold the workspaces; "
            f"lru: warm, a node counted cold for a pipeline once {LRU_DEPTH} others "
            "ran there since (a rule under study); lru-learned: lru with the depth "
            "read from the run's own outcomes, as outcomes --workspaces reads it",
        )
        parser.add_argument(
            "--from-db",
            action="store_true",
            help="replay the recorded placement ledger instead of a synthetic load",
        )
        parser.add_argument("--json", action="store_true", help="print JSON")
        for field in dataclasses.fields(Scenario):
            parser.add_argument(
                "--" + field.name.replace("_", "-"),
                dest=field.name,
                type=type(field.default),
                default=None,
                help=f"{HELP[field.name]} (default {field.default})",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        strategies = tuple(s for s in options["strategies"].split(",") if s)
        known = STRATEGY_NAMES + EXTRA_STRATEGIES
        unknown = sorted(set(strategies) - set(known))
        if unknown or not strategies:
            raise CommandError(
                f"unknown strategies {unknown}; choose from {list(known)}"
            )
        overrides = {f.name: options[f.name] for f in dataclasses.fields(Scenario)}
        self._check(overrides)
        names = (
            list(SCENARIOS) if options["scenario"] == "all" else [options["scenario"]]
        )
        reports = {}
        for name in names:
            scenario = with_options(SCENARIOS[name], **overrides)
            workload = None
            if options["from_db"]:
                workload, used = ledger_workload(scenario)
                if not workload.pods:
                    raise CommandError("the placement ledger has no pipeline pods")
                if overrides["nodes"] is None:
                    scenario = dataclasses.replace(scenario, nodes=max(1, used))
            reports[name] = run(scenario, strategies, workload)
            if options["from_db"]:
                reports[name]["measured"] = measured_outcomes()
        if options["json"]:
            body = reports if len(reports) > 1 else reports[names[0]]
            self.stdout.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
            return
        for name, report in reports.items():
            source = "recorded ledger" if options["from_db"] else "synthetic"
            scenario = report["scenario"]
            shared = ""
            if report["shared_names"]:
                shared = (
                    f"; {report['shared_names']:.0%} of the pipelines share their "
                    "last segment with another CI system or language"
                )
            self.stdout.write(
                f"scenario {name} ({source}, {report['pods']} pods, "
                f"{scenario['nodes']} nodes, seed {scenario['seed']}{shared})"
            )
            self.stdout.write(format_table(report) + "\n")

    def _check(self, overrides: dict[str, Any]) -> None:
        positive = ("nodes", "cpu", "cache_slots", "pipelines", "languages", "tools")
        for name in positive + ("arrival", "pod_cpu", "half_life_days", "weight"):
            value = overrides.get(name)
            if value is not None and value <= 0:
                raise CommandError(f"--{name.replace('_', '-')} must be greater than 0")
        for name in ("runs", "fanout", "run_time", "cold_extra", "partial_extra"):
            value = overrides.get(name)
            if value is not None and value < 0:
                raise CommandError(f"--{name.replace('_', '-')} must not be negative")
        percentage = overrides.get("percentage")
        if percentage is not None and not 0 < percentage <= 100:
            raise CommandError("--percentage must be between 1 and 100")
        for name in ("fanout_share", "shared_names", "gain_lot", "gain_little"):
            share = overrides.get(name)
            if share is not None and not 0 <= share <= 1:
                option = "--" + name.replace("_", "-")
                raise CommandError(f"{option} must be between 0 and 1")
        systems = overrides.get("systems")
        if systems is not None and systems < 0:
            raise CommandError("--systems must not be negative")
