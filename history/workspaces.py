"""How long a pipeline's workspace lasts on a node, from the ledger: the startup of
exact placements by their depth, and by their age.

A node's caches (pulled images, build caches, workspaces) are bounded, so the
oldest go as other pipelines run there. The history calls a placement exact when
the pipeline ran on that node before, however long ago. The ledger holds the
order: each placement's node, pipeline label and time. Walking each node's
placements in that order gives every placement its *depth*: how many other
pipelines were placed on the node since this pipeline last was (0: it was the
last one there), and its *age*: the time since then. If exact placements start
like cold (or partial) ones from some depth on, the workspaces on these nodes last
about that many other pipelines. That depth is what `simulate`'s `lru` rule
assumes, and what `lru-learned` reads from its own run (docs/scoring.md); this
report measures it on a cluster's own ledger, and the age from which they do.

Depths and ages are counted within the report's window: an exact placement whose
pipeline was not placed on that node earlier in the window is "before the window".
Depths past `DEEPEST` are not told apart: each node keeps its last DEEPEST + 1
pipelines in order, and the last time of each pipeline placed there, so the walk's
memory grows with the (node, pipeline) pairs, not with the placements. Used by
`manage.py outcomes --workspaces` and `GET /api/outcomes/workspaces/`.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone

from history import queries
from history.models import LearnedDepth, Placement
from history.outcomes import (
    MIN_RUNS,
    WINDOW,
    Row,
    iso,
    number_text,
    summarize,
)
from history.reader.depths import DEEPEST, depth_in

# Depth buckets (first, last) of the report; None: no upper end.
BUCKETS: tuple[tuple[int, int | None], ...] = (
    (0, 0), (1, 1), (2, 2), (3, 3), (4, 7), (8, 15), (16, None),
)  # fmt: skip
# Age buckets (from, to) in seconds: the time since the same pipeline was last
# placed on the node; None: no upper end.
AGES: tuple[tuple[int, int | None], ...] = (
    (0, 600), (600, 3600), (3600, 6 * 3600), (6 * 3600, 86400),
    (86400, 3 * 86400), (3 * 86400, 7 * 86400), (7 * 86400, None),
)  # fmt: skip
BEFORE_WINDOW = "before the window"
# The share of the penalty (the partial or cold median startup - depth 0's) at
# which a bucket's exact placements count as starting like ones that missed.
GONE_SHARE = 0.5
# The most placements `learn_depth` reads (the newest of its window), which bounds
# the watcher's memory while it measures: the walk of 300 000 placements over
# 1 000 nodes peaked at 38 MiB (tracemalloc), most of it the startups it reports.
LEARN_ROWS = 300_000


def bucket_name(first: int, last: int | None) -> str:
    if last is None:
        return f"{first}+"
    return str(first) if first == last else f"{first}-{last}"


def age_name(first: int, last: int | None) -> str:
    """(600, 3600) -> "10 min-1 h", (604800, None) -> "7 d+"."""
    return f"{_span(first)}+" if last is None else f"{_span(first)}-{_span(last)}"


def _span(seconds: int) -> str:
    if seconds == 0:
        return "0"
    if seconds < 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h" if seconds < 86400 else f"{seconds // 86400} d"


class NodeOrder:
    """The order in which pipelines were placed on each node, fed placements in the
    order they were bound. Memory: DEEPEST + 1 labels per node, and each (node,
    label) pair once with its last placement's time."""

    def __init__(self) -> None:
        self.recent: dict[str, list[str]] = {}  # per node, most recent first
        self.last: dict[str, dict[str, float]] = {}  # per node, label -> time

    def depth(self, node: str, label: str) -> int | None:
        """The other labels placed on `node` since `label` last was, capped at
        DEEPEST; None when it was not placed there before."""
        if label not in self.last.get(node, ()):
            return None
        return depth_in(self.recent.get(node, []), label)

    def age(self, node: str, label: str, at: float) -> float | None:
        """Seconds from `label`'s last placement on `node` to `at` (None: never)."""
        last = self.last.get(node, {}).get(label)
        return None if last is None else at - last

    def place(self, node: str, label: str, at: float = 0.0) -> int | None:
        """Record a placement at `at` (Unix seconds); returns its depth (`depth`
        just before it)."""
        depth = self.depth(node, label)
        order = self.recent.setdefault(node, [])
        if label in order:
            order.remove(label)
        order.insert(0, label)
        del order[DEEPEST + 1 :]
        self.last.setdefault(node, {})[label] = at
        return depth

    def forget(self, node: str) -> None:
        """A node replaced: what ran on the machine before is gone with it."""
        self.recent.pop(node, None)
        self.last.pop(node, None)


def _bucket_of(depth: int | None) -> str:
    if depth is None:
        return BEFORE_WINDOW
    for first, last in BUCKETS:
        if depth >= first and (last is None or depth <= last):
            return bucket_name(first, last)
    raise AssertionError(depth)  # the last bucket has no upper end


def _age_of(age: float | None) -> str:
    if age is None:
        return BEFORE_WINDOW
    for first, last in AGES:
        if last is None or age < last:
            return age_name(first, last)
    raise AssertionError(age)  # the last bucket has no upper end


def workspace_report(
    *,
    label: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> dict[str, Any]:
    """Startup of exact placements bound in [since, until) by depth, beside the
    partial and cold placements of the same window (default the last 30 days).

    `label` narrows what is reported to a pipeline given as a key or label value
    (as `outcomes.outcome_report` does); depths still count every pipeline placed
    on the node. Returns {"depths": [{"depth", **S}], "ages": [{"age", **S}],
    "partial": S, "cold": S, "gone_from", "gone_reason", "gone_after",
    "gone_after_reason", "since", "until"}, S as in
    `outcomes.summarize` (see `depth_report`).
    """
    until = until or timezone.now()
    since = since or until - WINDOW
    placed = Placement.objects.filter(bound_at__gte=since, bound_at__lt=until)
    wanted = None
    if label:
        mine = queries.placements_of_pipeline(value=label).filter(
            bound_at__gte=since, bound_at__lt=until
        )
        wanted = set(mine.values_list("label", flat=True))
        # A depth counts only the placements on its own node: the nodes where
        # the pipeline ran are all the walk needs.
        placed = placed.filter(node__in=mine.values("node"))
    rows = placed.order_by("node", "bound_at", "pk").values_list(
        "node",
        "label",
        "bound_at",
        "warmth",
        "outcome",
        "startup_seconds",
        "run_seconds",
    )
    timed = (
        (node, name, at.timestamp(), warmth, outcome, startup, run)
        for node, name, at, warmth, outcome, startup, run in rows.iterator()
    )
    return {
        **depth_report(timed, wanted=wanted, node_by_node=True),
        "since": iso(since),
        "until": iso(until),
    }


def learning_since(now: datetime, most: int = LEARN_ROWS) -> datetime:
    """Where `learn_depth`'s window ending `now` starts: WINDOW before it, or later
    when more than `most` placements were bound since (then the newest `most`, and
    those bound in the same instant as the oldest of them)."""
    since = now - WINDOW
    newest = Placement.objects.filter(bound_at__gte=since, bound_at__lt=now)
    cutoff = list(
        newest.order_by("-bound_at").values_list("bound_at", flat=True)[most - 1 : most]
    )
    return cutoff[0] if cutoff else since


def learn_depth(*, now: datetime | None = None, most: int = LEARN_ROWS) -> LearnedDepth:
    """Measure the depth from which workspaces look gone, over the window that ends
    `now` (default: now; at most about `most` placements, `learning_since`), and
    store it for KSSCHED_WORKSPACE_DEPTH=auto: the report's `gone_from`, or None
    with its reason."""
    now = now or timezone.now()
    report = workspace_report(since=learning_since(now, most), until=now)
    depth = report["gone_from"]
    reason = "" if depth is not None else str(report["gone_reason"] or "")
    learned, _ = LearnedDepth.objects.update_or_create(
        pk=1,
        defaults={"depth": depth, "reason": reason[:500], "measured_at": now},
    )
    return learned


def depth_report(
    rows: Iterable[tuple[str, str, float, str, str, float | None, float | None]],
    *,
    wanted: Container[str] | None = None,
    node_by_node: bool = False,
) -> dict[str, Any]:
    """The report's figures from placements (node, label, bound at in Unix seconds,
    warmth, outcome, startup, run) in the order they were bound. Only the labels in
    `wanted` (all: None) are reported; every placement counts in the depths and
    ages. Placements without an outcome are not reported. `node_by_node`: the rows
    come one node after another, so a node's order is dropped once the next
    node's rows start (the walk then holds one node's at a time).

    Exact placements by depth and by age (the time since the same pipeline was
    last placed on the node); `gone_from`, the first depth, and `gone_after`, the
    first age in seconds, whose placements start like ones that missed their
    workspace (`first_gone`), each None with the reason why."""
    depth_names = [BEFORE_WINDOW, *(bucket_name(*b) for b in BUCKETS)]
    age_names = [BEFORE_WINDOW, *(age_name(*b) for b in AGES)]
    by_depth: dict[str, list[Row]] = {name: [] for name in depth_names}
    by_age: dict[str, list[Row]] = {name: [] for name in age_names}
    partial: list[Row] = []
    cold: list[Row] = []
    order = NodeOrder()
    previous = None
    for node, label, at, warmth, outcome, startup, run in rows:
        if node_by_node and node != previous:
            if previous is not None:
                order.forget(previous)
            previous = node
        age = order.age(node, label, at)
        depth = order.place(node, label, at)
        if not outcome or (wanted is not None and label not in wanted):
            continue
        row = (outcome, startup, run)
        if warmth == Placement.Warmth.EXACT:
            by_depth[_bucket_of(depth)].append(row)
            by_age[_age_of(age)].append(row)
        elif warmth == Placement.Warmth.PARTIAL:
            partial.append(row)
        elif warmth == Placement.Warmth.COLD:
            cold.append(row)
    report: dict[str, Any] = {
        "depths": [{"depth": n, **summarize(by_depth[n])} for n in depth_names],
        "ages": [{"age": n, **summarize(by_age[n])} for n in age_names],
        "partial": summarize(partial),
        "cold": summarize(cold),
    }
    # Each bucket's first value beside its figures, BEFORE_WINDOW's left out.
    depths = [(b[0], d) for b, d in zip(BUCKETS, report["depths"][1:], strict=True)]
    ages = [(b[0], a) for b, a in zip(AGES, report["ages"][1:], strict=True)]
    warm = depths[0][1]
    report["gone_from"], report["gone_reason"] = first_gone(
        report, warm, depths[1:], "depth"
    )
    report["gone_after"], report["gone_after_reason"] = first_gone(
        report, warm, ages, "age"
    )
    return report


def first_gone(
    report: dict[str, Any],
    warm: dict[str, Any],
    buckets: list[tuple[int, dict[str, Any]]],
    what: str,
) -> tuple[int | None, str | None]:
    """(the first value of the first of `buckets` whose exact placements start like
    ones that did not find their workspace, None), or (None, why none is given).

    `warm` (depth 0's figures) is how a workspace found starts. The reference is
    the faster of the partial and the cold placements' median startup (a workspace
    gone may leave its shared toolchain behind), each class counting with MIN_RUNS
    successful runs. A bucket starts like them when its median is at least
    GONE_SHARE of the way from `warm`'s median to the reference; each bucket, and
    `warm`, needs MIN_RUNS successful runs too."""
    others = [
        report[warmth]["startup_p50"]
        for warmth in ("partial", "cold")
        if report[warmth]["runs"] >= MIN_RUNS
    ]
    if warm["runs"] < MIN_RUNS or not others:
        return None, (
            f"needs at least {MIN_RUNS} successful runs at depth 0 and {MIN_RUNS} "
            f"partial or cold; has {warm['runs']} at depth 0, "
            f"{report['partial']['runs']} partial and {report['cold']['runs']} cold"
        )
    fast = warm["startup_p50"]
    penalty = min(others) - fast
    if penalty <= 0:
        return None, "partial or cold placements start no slower than depth 0's"
    for first, bucket in buckets:
        if bucket["runs"] >= MIN_RUNS and (
            bucket["startup_p50"] - fast >= GONE_SHARE * penalty
        ):
            return first, None
    return None, f"no {what} with enough runs starts like the partial or cold ones"


def format_workspaces(report: dict[str, Any]) -> str:
    """`workspace_report` as the table `manage.py outcomes --workspaces` prints."""
    depths = [(f"depth {d['depth']}", d) for d in report["depths"]]
    ages = [(f"age {a['age']}", a) for a in report["ages"]]
    others = [("partial", report["partial"]), ("cold", report["cold"])]
    lines = [
        f"Pipeline pods bound from {report['since']} to {report['until']}",
        "Exact placements by depth (the other pipelines placed on the node since",
        "the pipeline last was) and by age (the time since). Medians and p90 over",
        "successful runs, in seconds.",
        "",
        *_rows(depths + others),
        "",
        *_rows(ages),
        "",
    ]
    if (depth := report["gone_from"]) is not None:
        lines.append(f"From depth {depth} on, exact placements start like cold ones")
        lines.append(f"(or partial): workspaces last about {depth} other pipelines.")
    else:
        lines.append(f"No depth where workspaces look gone: {report['gone_reason']}.")
    if (after := report["gone_after"]) is not None:
        lines.append(f"From an age of {_span(after)} on, they start like cold too.")
    else:
        why = report["gone_after_reason"]
        lines.append(f"No age where workspaces look gone: {why}.")
    return "\n".join(lines)


def _rows(sections: list[tuple[str, dict[str, Any]]]) -> list[str]:
    header = f"{'placements':<24} {'runs':>5} {'startup p50':>11} {'p90':>8}"
    lines = [header, "-" * len(header)]
    for name, s in sections:
        lines.append(
            f"{name:<24} {s['runs']:>5} {number_text(s['startup_p50']):>11} "
            f"{number_text(s['startup_p90']):>8}"
        )
    return lines
