"""What warmth is worth to each pipeline, learned from its own outcomes.

Pure: samples in, estimates and weights out; no database (`history.worth_feed`
feeds a process's book from the ledger, the simulator feeds its own). What one
pipeline's samples say on their own (what an exact placement saves it over each
class, with an interval) is `history.worth_samples`; this module holds the book of
every pipeline (`MAX_PIPELINES` of them, least recently updated forgotten first)
and what it makes of them:

**Worth.** A pipeline's saving over each class, in units of what warmth saves the
median pipeline over that class (`WorthBook.units`), averaged over the classes by
their comparisons: 1 is a typical pipeline, 0 one that gains nothing, 3 one that
gains three times as much. Units make the worth independent of how often the
pipeline happened to land partial rather than cold, and of the fleet's mix.

**Borrowing strength.** A pipeline with few runs is shrunk toward its parent
prefix (`java-javamaven-*`, then `java-*`, then the fleet):
`(n w + k p) / (n + k)`, `n` its comparisons (the fewer of exact and other runs),
`k = PRIOR_RUNS`, `p` the parent's worth: the median worth of the pipelines under
that prefix, itself shrunk toward its own parent by `PRIOR_PIPELINES`; the fleet's
toward 1, today's pull, so that a fleet with little evidence stays near it.

**Weight** (`weight_for`), what `warm` scales the pull by: no outcomes at all
keeps today's pull, 1; otherwise the credited worth rounded to the nearest `STEP`,
between 0 and `MAX_WEIGHT`. The credited worth is the shrunk worth, or 0 once the
pipeline has `MIN_RUNS` runs on each side and its own startup interval includes 0
(its run interval too): "saves nothing measurable". The weight never decreases
as the credited worth grows.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from history.labels import path_keys
from history.worth_samples import (
    MIN_RUNS,
    OTHERS,
    SAMPLES,
    WARMTHS,
    Difference,
    Samples,
    difference_over,
    saved_seconds,
    savings,
    startup_comparisons,
)

# Pipelines remembered; beyond it the least recently updated is forgotten.
MAX_PIPELINES = 20_000
# Pseudo-runs of the parent prefix's worth in a pipeline's.
PRIOR_RUNS = 3
# Pseudo-pipelines of the parent's worth in a prefix's.
PRIOR_PIPELINES = 3
STEP = 0.5
MAX_WEIGHT = 2.0
# The unit of worth (what warmth saves the median pipeline) is at least this many
# seconds: a fleet where warmth saves nothing does not make noise look large.
MIN_UNIT = 1.0
FLEET = ""
# The worth of today's pull (weight 1): what the fleet's worth is shrunk toward.
NEUTRAL = 1.0


@dataclass(frozen=True)
class Estimate:
    """What an exact placement saves one pipeline, and the weight that follows.

    `startup` (exact vs partial and cold runs), `over_partial`, `over_cold` and
    `run` are the pipeline's own differences (None without both sides); `seconds`
    what its own data says an exact placement saves (startup, plus run when
    measurable). `own` is its worth relative to the fleet (its saving over each
    class in units of what it saves the median pipeline, `units`), `prior` the parent
    prefix's it is
    shrunk toward, `credited` what the weight is taken from; `weight` and `reason`
    what the scoring uses and why.
    """

    label: str
    runs: dict[str, int]
    startup: Difference | None
    over_partial: Difference | None
    over_cold: Difference | None
    run: Difference | None
    seconds: float | None
    own: float | None
    prior: float | None
    credited: float | None
    units: dict[str, float]
    weight: float
    reason: str


def weight_for(credited: float | None) -> float:
    """The warm pull's scale for a credited relative worth: 1 without one; else the
    worth rounded to the nearest STEP, between 0 and MAX_WEIGHT. Non-decreasing."""
    if credited is None:
        return 1.0
    steps = math.floor(credited / STEP + 0.5)
    return min(MAX_WEIGHT, max(0.0, steps * STEP))


def band(weight: float) -> str:
    """The metrics band of a weight in use: off, weaker, default or stronger."""
    if weight <= 0:
        return "off"
    if weight < 1:
        return "weaker"
    if weight == 1:
        return "default"
    return "stronger"


BANDS = ("off", "weaker", "default", "stronger")


def prefixes(label: str) -> list[str]:
    """The label's prefix pools, general to specific, after the fleet's."""
    return [FLEET, *path_keys(label)[:-1]]


class WorthBook:
    """Outcome samples of every pipeline; estimates on demand, kept until the next
    `add`. Not thread-safe: its owner (`worth_feed`, the simulator) serialises it.
    """

    def __init__(self, *, max_pipelines: int = MAX_PIPELINES):
        self.pipelines: OrderedDict[str, Samples] = OrderedDict()
        self.max_pipelines = max_pipelines
        # prefix (FLEET for all) -> the labels under it.
        self.children: dict[str, set[str]] = {}
        self._savings: dict[str, dict[str, tuple[float, int]]] = {}
        self._compared: dict[str, int] = {}
        self._units: dict[str, float] | None = None
        # prefix -> the worths of the pipelines under it that have one, sorted.
        self._worths: dict[str, list[float]] = {}
        self._estimates: dict[str, Estimate] = {}

    def add(self, label: str, warmth: str, startup: float, run: float) -> None:
        """One successful pod of `label` with its warmth and times (seconds)."""
        if warmth not in WARMTHS or not label:
            return
        samples = self.pipelines.get(label)
        if samples is None:
            if len(self.pipelines) >= self.max_pipelines:
                self._forget(next(iter(self.pipelines)))
            samples = self.pipelines[label] = Samples(SAMPLES)
            for pool in prefixes(label):
                self.children.setdefault(pool, set()).add(label)
        else:
            self.pipelines.move_to_end(label)
        samples.add(warmth, startup, run)
        self._savings.pop(label, None)
        self._compared.pop(label, None)
        self._units = None
        self._worths.clear()
        self._estimates.clear()

    def add_all(self, rows: Iterable[tuple[str, str, float, float]]) -> None:
        for label, warmth, startup, run in rows:
            self.add(label, warmth, startup, run)

    def _forget(self, label: str) -> None:
        del self.pipelines[label]
        self._savings.pop(label, None)
        self._compared.pop(label, None)
        for pool in prefixes(label):
            labels = self.children.get(pool)
            if labels is not None:
                labels.discard(label)
                if not labels:
                    del self.children[pool]

    def savings(self, label: str) -> dict[str, tuple[float, int]]:
        """other class -> (seconds an exact placement saves over it, comparisons),
        for the classes the pipeline has runs of on both sides."""
        found = self._savings.get(label)
        if found is None:
            found = self._savings[label] = savings(self.pipelines[label])
        return found

    def units(self) -> dict[str, float]:
        """other class -> what warmth saves the median pipeline over it (at least
        MIN_UNIT seconds): a pipeline's worth is measured in these units."""
        if self._units is None:
            by_class: dict[str, list[float]] = {other: [] for other in OTHERS}
            for label in self.pipelines:
                for other, (seconds, _) in self.savings(label).items():
                    by_class[other].append(seconds)
            self._units = {
                other: max(MIN_UNIT, statistics.median(values) if values else 0.0)
                for other, values in by_class.items()
            }
        return self._units

    def worth(self, label: str) -> tuple[float | None, int]:
        """The pipeline's own worth (None without a comparison) and comparisons."""
        units = self.units()
        total, weights = 0.0, 0
        for other, (seconds, comparisons) in self.savings(label).items():
            total += comparisons * seconds / units[other]
            weights += comparisons
        if not weights:
            return None, 0
        compared = self._compared.get(label)
        if compared is None:
            compared = self._compared[label] = startup_comparisons(
                self.pipelines[label]
            )
        return total / weights, compared

    def _pool_worths(self, pool: str) -> list[float]:
        """The worths of the pipelines under `pool` that have one, sorted."""
        found = self._worths.get(pool)
        if found is None:
            found = self._worths[pool] = sorted(
                worth
                for child in self.children.get(pool, ())
                if (worth := self.worth(child)[0]) is not None
            )
        return found

    def _prior(self, label: str) -> float | None:
        """What the pipeline's siblings say: under each prefix, from the fleet
        down, the median worth of the other pipelines (leaving this one out, so
        that its own runs are not counted again), shrunk toward the parent's."""
        own = self.worth(label)[0] if label in self.pipelines else None
        # Above the fleet, today's pull: a fleet with little evidence stays near it.
        prior: float | None = NEUTRAL
        for pool in prefixes(label):
            others = self._pool_worths(pool)
            median, count = median_without(others, own)
            prior = shrink(median, count, prior, PRIOR_PIPELINES)
        return prior

    def estimate(self, label: str) -> Estimate:
        """What an exact placement saves `label`, and its weight."""
        found = self._estimates.get(label)
        if found is None:
            found = self._estimate(label)
            # Kept for the pipelines remembered only: bounded by MAX_PIPELINES
            # whatever labels callers ask about.
            if label in self.pipelines:
                self._estimates[label] = found
        return found

    def _estimate(self, label: str) -> Estimate:
        samples = self.pipelines.get(label)
        units = self.units()
        runs = {w: samples.runs(w) if samples else 0 for w in WARMTHS}
        if not samples:
            return Estimate(
                label, runs, None, None, None, None, None, None, None, None,
                units, 1.0, "no outcomes yet: today's pull",
            )  # fmt: skip
        startup = difference_over(samples, "startup", OTHERS)
        run = difference_over(samples, "run", OTHERS)
        own, comparisons = self.worth(label)
        prior = self._prior(label)
        credited = shrink(own, comparisons, prior, PRIOR_RUNS)
        reason = ""
        if (
            startup is not None
            and startup.comparisons >= MIN_RUNS
            and startup.low <= 0
            and not (run is not None and run.measurable and run.low > 0)
        ):
            credited, reason = 0.0, "saves nothing measurable: its interval holds 0"
        weight = weight_for(credited)
        if not reason:
            if credited is None:
                reason = "no comparison anywhere yet: today's pull"
            else:
                borrowed = ""
                if comparisons < MIN_RUNS:
                    borrowed = ", borrowing from its prefix"
                reason = f"worth {credited:.2f}x a typical pipeline's{borrowed}"
        return Estimate(
            label=label,
            runs=runs,
            startup=startup,
            over_partial=difference_over(samples, "startup", ("partial",)),
            over_cold=difference_over(samples, "startup", ("cold",)),
            run=run,
            seconds=saved_seconds(startup, run),
            own=own,
            prior=prior,
            credited=credited,
            units=units,
            weight=weight,
            reason=reason,
        )

    def weight(self, label: str) -> float:
        return self.estimate(label).weight

    def settle(self) -> None:
        """Work out what every estimate shares now (a process's book after a
        refresh): the units and every prefix's worth. An estimate then costs one
        pipeline's own figures, worked out on first use and kept."""
        self.units()
        for pool in self.children:
            self._pool_worths(pool)

    def bands(self) -> dict[str, int]:
        """How many remembered pipelines are at each weight band."""
        counts = dict.fromkeys(BANDS, 0)
        for label in self.pipelines:
            counts[band(self.estimate(label).weight)] += 1
        return counts


def median_without(
    ordered: list[float], value: float | None
) -> tuple[float | None, int]:
    """The median of sorted `ordered` with one occurrence of `value` left out (all
    of it when `value` is None or absent), and how many values that is."""
    index = bisect.bisect_left(ordered, value) if value is not None else len(ordered)
    if index >= len(ordered) or ordered[index] != value:
        count = len(ordered)
        return (statistics.median(ordered) if ordered else None), count
    count = len(ordered) - 1
    if not count:
        return None, 0

    def at(position: int) -> float:
        return ordered[position if position < index else position + 1]

    return (at((count - 1) // 2) + at(count // 2)) / 2, count


def shrink(
    own: float | None, weight: int, prior: float | None, strength: int
) -> float | None:
    """`own` (from `weight` runs or pipelines) shrunk toward `prior` by `strength`
    pseudo-observations of it."""
    if own is None:
        return prior
    if prior is None:
        return own
    return (weight * own + strength * prior) / (weight + strength)
