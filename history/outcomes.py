"""What warm placement saves: startup and run time by warmth, per pipeline.

The one home of the outcomes report, used by `manage.py outcomes`, `GET
/api/outcomes/`, the admin pipeline page and the admin index. It reads the times the
watcher recorded on each placement (`history.timings`, `ledger.record_outcome`).

For each warmth class (exact, partial, cold): `runs` counts the pods that Succeeded
with both times recorded (the sample the medians are taken over), `failed` the pods
that Failed; the median and p90 (nearest rank) of startup and run seconds are over
the successful runs only, None without any. Time saved for a label is
(median startup+run of its cold runs - median of its exact runs) x its exact runs,
given only when both classes have at least `MIN_RUNS` successful runs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from history import queries
from history.models import Placement
from history.validation import RANGE_TEXT, is_instant_in_range

WARMTHS: tuple[str, ...] = tuple(Placement.Warmth.values)
# The default window: the admin index shows time saved over the same 30 days.
WINDOW = timedelta(days=30)
MIN_RUNS = 5
ROUND_TO = 3

# (outcome, startup seconds, run seconds) of one ended placement.
Row = tuple[str, float | None, float | None]


def median(values: Sequence[float]) -> float | None:
    """The plain median (mean of the two middle values for an even count)."""
    return round(statistics.median(values), ROUND_TO) if values else None


def p90(values: Sequence[float]) -> float | None:
    """The 90th percentile by the nearest-rank method: the ceil(0.9 n)-th smallest."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[math.ceil(0.9 * len(ordered)) - 1], ROUND_TO)


def summarize(rows: Iterable[Row]) -> dict[str, Any]:
    """The figures of one warmth class: {runs, failed, startup_p50, startup_p90,
    run_p50, run_p90}."""
    startups: list[float] = []
    runs: list[float] = []
    failed = 0
    for outcome, startup, run in rows:
        if outcome == Placement.Outcome.FAILED:
            failed += 1
        elif outcome == Placement.Outcome.SUCCEEDED:
            if startup is not None and run is not None:
                startups.append(startup)
                runs.append(run)
    return {
        "runs": len(runs),
        "failed": failed,
        "startup_p50": median(startups),
        "startup_p90": p90(startups),
        "run_p50": median(runs),
        "run_p90": p90(runs),
    }


def saved_seconds(by_warmth: dict[str, list[Row]]) -> tuple[float | None, str | None]:
    """(seconds saved, None), or (None, why not) for one label's rows by warmth."""
    totals = {
        warmth: [
            startup + run
            for outcome, startup, run in by_warmth.get(warmth, [])
            if outcome == Placement.Outcome.SUCCEEDED
            and startup is not None
            and run is not None
        ]
        for warmth in (Placement.Warmth.EXACT, Placement.Warmth.COLD)
    }
    exact, cold = totals[Placement.Warmth.EXACT], totals[Placement.Warmth.COLD]
    if len(exact) < MIN_RUNS or len(cold) < MIN_RUNS:
        return None, (
            f"needs at least {MIN_RUNS} successful exact and {MIN_RUNS} cold runs; "
            f"has {len(exact)} exact and {len(cold)} cold"
        )
    saved = (statistics.median(cold) - statistics.median(exact)) * len(exact)
    return round(saved, ROUND_TO), None


def outcome_report(
    *,
    label: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> dict[str, Any]:
    """The report over placements bound in [since, until), default the last 30 days.

    `label` narrows it to a pipeline given as a key or label value, matched as on the
    admin pipeline page (`queries.placements_of_pipeline`). Returns
    {"overall": {warmth: S}, "pipelines": [{"label", warmth: S..., "saved_seconds",
    "saved_reason"}], "since", "until"} with S as in `summarize`, labels sorted.
    Placements without a warmth class are left out.
    """
    until = until or timezone.now()
    since = since or until - WINDOW
    placements = (
        queries.placements_of_pipeline(value=label)
        if label
        else Placement.objects.all()
    )
    rows = (
        placements.filter(
            bound_at__gte=since,
            bound_at__lt=until,
            warmth__in=WARMTHS,
        )
        .exclude(outcome="")
        .values_list("label", "warmth", "outcome", "startup_seconds", "run_seconds")
        .order_by()
    )
    overall: dict[str, list[Row]] = {warmth: [] for warmth in WARMTHS}
    by_label: dict[str, dict[str, list[Row]]] = {}
    for row_label, warmth, outcome, startup, run in rows.iterator():
        row = (outcome, startup, run)
        overall[warmth].append(row)
        by_label.setdefault(row_label, {w: [] for w in WARMTHS})[warmth].append(row)
    pipelines = []
    for row_label in sorted(by_label):
        classes = by_label[row_label]
        saved, reason = saved_seconds(classes)
        pipelines.append(
            {
                "label": row_label,
                **{warmth: summarize(classes[warmth]) for warmth in WARMTHS},
                "saved_seconds": saved,
                "saved_reason": reason,
            }
        )
    return {
        "overall": {warmth: summarize(overall[warmth]) for warmth in WARMTHS},
        "pipelines": pipelines,
        "since": iso(since),
        "until": iso(until),
    }


def total_saved(report: dict[str, Any]) -> tuple[float | None, int]:
    """The seconds saved summed over the pipelines that have an estimate, and how
    many have one; (None, 0) when none has."""
    known = [p["saved_seconds"] for p in report["pipelines"]]
    known = [value for value in known if value is not None]
    return (round(sum(known), ROUND_TO) if known else None), len(known)


def parse_instant(text: str) -> datetime:
    """An ISO 8601 date or date-time; naive values are UTC. ValueError if unreadable."""
    moment = parse_datetime(text)
    if moment is None:
        day = parse_date(text)
        if day is None:
            raise ValueError(f"not an ISO 8601 date or date-time: {text!r}")
        moment = datetime(day.year, day.month, day.day)
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    if not is_instant_in_range(moment):
        raise ValueError(f"{text!r} is outside the dates one can look up: {RANGE_TEXT}")
    return moment


def duration_text(seconds: float | None) -> str:
    """19.5 -> "19.5 s", 1234.5 -> "20 min 34 s", 7300 -> "2 h 1 min"; None -> "-"."""
    if seconds is None:
        return "-"
    if abs(seconds) < 60:
        return f"{number_text(round(seconds, 1))} s"
    sign = "-" if seconds < 0 else ""
    left = round(abs(seconds))
    hours, left = divmod(left, 3600)
    minutes, secs = divmod(left, 60)
    if hours:
        return f"{sign}{hours} h {minutes} min"
    if minutes:
        return f"{sign}{minutes} min {secs} s"
    return f"{sign}{secs} s"


def format_sections(
    sections: list[tuple[str, dict[str, Any]]],
    first: str,
    *,
    decimals: int | None = None,
) -> list[str]:
    """The table lines of named sections ({warmth: S}), one line per warmth class;
    `first` heads the name column. With `decimals`, every time has exactly that
    many (aligned columns); without, as few as it needs."""

    def cell(value: float | None) -> str:
        if value is None or decimals is None:
            return number_text(value)
        return f"{value:.{decimals}f}"

    header = (
        f"{first:<32} {'warmth':<8} {'runs':>5} {'failed':>6} "
        f"{'startup p50':>11} {'p90':>8} {'run p50':>9} {'p90':>8}"
    )
    lines = [header, "-" * len(header)]
    for name, section in sections:
        for index, warmth in enumerate(WARMTHS):
            s = section[warmth]
            lines.append(
                f"{name if index == 0 else '':<32} {warmth:<8} {s['runs']:>5} "
                f"{s['failed']:>6} {cell(s['startup_p50']):>11} "
                f"{cell(s['startup_p90']):>8} {cell(s['run_p50']):>9} "
                f"{cell(s['run_p90']):>8}"
            )
    return lines


def format_report(report: dict[str, Any]) -> str:
    """`outcome_report` as the table `manage.py outcomes` prints."""
    sections = [("(all pipelines)", report["overall"])]
    sections += [(p["label"], p) for p in report["pipelines"]]
    lines = [
        f"Pipeline pods bound from {report['since']} to {report['until']}",
        "Medians and p90 (nearest rank) over successful runs, in seconds.",
        "",
        *format_sections(sections, "pipeline"),
    ]
    lines += ["", "Time saved ((cold - exact median startup+run) x exact runs):"]
    for pipeline in report["pipelines"]:
        saved = pipeline["saved_seconds"]
        text = (
            f"{number_text(saved)} s ({duration_text(saved)})"
            if saved is not None
            else f"unknown: {pipeline['saved_reason']}"
        )
        lines.append(f"  {pipeline['label']:<32} {text}")
    if not report["pipelines"]:
        lines.append("  no ended pipeline pods in this window")
    total, counted = total_saved(report)
    if total is not None:
        lines.append(
            f"  {'total':<32} {number_text(total)} s ({duration_text(total)}) "
            f"over {counted} pipeline(s)"
        )
    return "\n".join(lines)


def number_text(value: float | None) -> str:
    """12.0 -> "12", 12.25 -> "12.25"; None -> "-"."""
    if value is None:
        return "-"
    return f"{value:.3f}".rstrip("0").rstrip(".")


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()
