"""The pipeline page's "What warmth is worth" block (`history.worth`).

What an exact placement saves the pipeline, from the process's book of outcomes
(`history.worth_feed`, read again first: the admin is not latency-critical), and
the weight the `warm` strategy scales its pull by, with why: the learned estimate,
or what overrides it (another strategy, KSSCHED_WORTH off, the KeyPolicy of the
label's most specific segment that has one, as `rules.resolve_policy` picks it).
Plain words; the template escapes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings

from extender.scoring.rules import Policy, resolve_policy, with_worth
from history.models import KeyPolicy
from history.outcomes import duration_text, number_text
from history.reader import Policies
from history.worth import Estimate
from history.worth_feed import process_worth
from history.worth_samples import MIN_RUNS, SAMPLES, WARMTHS, Difference


def seconds_text(seconds: float) -> str:
    """12.345 -> "12.3" (tenths: the samples are kept as 32-bit floats)."""
    return number_text(round(seconds, 1))


def interval_text(low: float, high: float) -> str:
    return f"{seconds_text(low)}–{seconds_text(high)} s"


def runs_text(runs: dict[str, int]) -> str:
    """ "12 exact, 0 partial, 9 cold runs"."""
    return ", ".join(f"{runs[w]} {w}" for w in WARMTHS) + " runs"


def difference_text(name: str, other: str, found: Difference | None) -> str | None:
    """One comparison (the `other` runs' median less the exact runs') in words,
    None when either side has no runs."""
    if found is None:
        return None
    if found.measurable:
        verdict = "measurable"
    elif found.comparisons < MIN_RUNS:
        verdict = f"too few runs to tell, {MIN_RUNS} of each needed"
    else:
        verdict = "not measurable: its interval holds 0"
    return (
        f"{name}: {duration_text(found.seconds)} "
        f"(interval {interval_text(found.low, found.high)}; "
        f"{found.exact} exact vs {found.other} {other} runs kept; {verdict})"
    )


def key_policy(segments: Sequence[str]) -> Policy:
    """The KeyPolicy that applies to a label with `segments`: the most specific
    segment's that has one (`resolve_policy`, as scoring resolves it)."""
    rows = KeyPolicy.objects.filter(key__in=set(segments))
    policies = Policies(
        keys={row.key: (row.enabled, row.weight) for row in rows},
        worth={row.key: row.worth for row in rows if row.worth != "auto"},
    )
    return resolve_policy(keys=segments, policies=policies)


def saving(estimate: Estimate) -> dict[str, Any]:
    """The headline: what an exact placement saves, its interval and the runs."""
    startup, run = estimate.startup, estimate.run
    runs = runs_text(estimate.runs)
    if estimate.seconds is None or startup is None:
        return {
            "seconds": None,
            "text": f"Not known yet ({runs}): a saving needs successful exact runs "
            "and partial or cold runs to compare them with.",
        }
    low, high = startup.low, startup.high
    run_counted = run is not None and run.measurable
    if run is not None and run_counted:
        low, high = low + run.low, high + run.high
    seconds = estimate.seconds
    verb = "saves" if seconds >= 0 else "costs"
    return {
        "seconds": seconds,
        "verb": verb,
        "text": duration_text(abs(seconds)),
        "detail": f"{runs}; interval {interval_text(low, high)}",
        "run_counted": run_counted,
    }


def weight_in_use(
    estimate: Estimate, policy: Policy, strategy: str
) -> tuple[float | None, str]:
    """(the weight the pull is scaled by, why): the number from `rules.with_worth`,
    as `WarmStrategy` applies it; None when a key policy opts the label out."""
    learned = f"learned {estimate.weight:g}: {estimate.reason}"
    if strategy != "warm":
        return 1.0, (
            f"the {strategy} strategy does not weigh what warmth is worth, only "
            f"warm does: every pipeline gets weight 1; {learned}"
        )
    source = policy.source
    if not policy.enabled:
        return None, (
            f"opted out by key policy {source}: no node preference at all; {learned}"
        )
    auto = settings.KSSCHED_WORTH == "auto"
    applied = with_worth(policy, estimate.weight if auto else 1.0, "")
    weight = applied.pull if applied.pull > 1 else applied.weight
    if policy.worth == "fixed":
        return weight, (
            f"fixed by key policy {source}: weight {policy.weight:g}, the key's "
            f"weight alone; {learned} (not applied)"
        )
    if policy.worth == "off":
        return weight, (
            f"off by key policy {source}: no warm pull, pins and bans still apply; "
            f"{learned} (not applied)"
        )
    if not auto:
        return weight, (
            "KSSCHED_WORTH is off: every pipeline gets weight 1, today's pull"
            + (f", times key policy {source}'s weight" if policy.weight != 1 else "")
            + f"; {learned} (not applied)"
        )
    why = estimate.reason
    if source is not None and policy.weight != 1:
        why += f"; times key policy {source}'s weight {policy.weight:g}"
    return weight, why


def worth_block(value: str, segments: Sequence[str], strategy: str) -> dict[str, Any]:
    """The block's context for the label `value` with `segments`."""
    feed = process_worth()
    read = feed.refresh(force=True)
    estimate = feed.estimate(value)
    weight, why = weight_in_use(estimate, key_policy(segments), strategy)
    details = [
        text
        for text in (
            difference_text(
                "Startup over partial runs", "partial", estimate.over_partial
            ),
            difference_text("Startup over cold runs", "cold", estimate.over_cold),
        )
        if text is not None
    ]
    run = difference_text("Run time over other runs", "partial or cold", estimate.run)
    if run is not None and estimate.run is not None:
        counted = "counted in the saving" if estimate.run.measurable else "not counted"
        details.append(f"{run}: {counted}")
    return {
        "has_outcomes": any(estimate.runs.values()),
        "saving": saving(estimate),
        "details": details,
        "weight": "none" if weight is None else f"{weight:g}",
        "why": why,
        "read": read,
        "samples": SAMPLES,
        "days": number_text(settings.KSSCHED_WORTH_DAYS),
    }
