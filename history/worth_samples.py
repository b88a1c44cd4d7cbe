"""One pipeline's own outcome samples, and what they say an exact placement saves it.

Pure, like `history.worth` (the book across pipelines: worth relative to the fleet,
borrowing strength, the weight), which builds on what lives here.

**Samples.** Each successful pod gives its startup and run seconds under its
warmth class (exact, partial, cold). A pipeline keeps the newest `SAMPLES` of each
class and measure in one fixed array, so rare classes (a warm pipeline's cold
runs) are not pushed out by common ones and memory is bounded per pipeline.

**Saving.** What an exact placement saves over a class (partial or cold): the
median startup of the pipeline's runs of that class less the median of its exact
runs, plus the same for run time when that difference is measurable. Medians make
it robust to a hung pod or a huge run. The interval is distribution-free: each
median's order-statistic interval at about 95 % (`median_interval`), the
difference taken end to end; "measurable" means it excludes 0 with at least
`MIN_RUNS` runs on each side. Run times vary far more and are compared often, so
their interval is taken at about 99.9 % (`Z_RUN`).
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

WARMTHS = ("exact", "partial", "cold")
MEASURES = ("startup", "run")
# The classes an exact placement is compared with.
OTHERS = ("partial", "cold")
# Newest samples kept per pipeline, warmth class and measure.
SAMPLES = 16
# Runs on each side (exact, other) before "nothing measurable" may be concluded.
MIN_RUNS = 8
# z of the two-sided 95 % interval of a median's ranks.
Z95 = 1.96
# Run times vary far more than startups and are compared for every pipeline and
# class at each refresh: a run difference counts only at about 99.9 %.
Z_RUN = 3.29

_SLOTS = len(WARMTHS) * len(MEASURES)
_INDEX = {
    (warmth, measure): i * len(MEASURES) + j
    for i, warmth in enumerate(WARMTHS)
    for j, measure in enumerate(MEASURES)
}


class Samples:
    """The newest `size` values of each (warmth, measure), in one float array."""

    __slots__ = ("size", "values", "added")

    def __init__(self, size: int):
        self.size = size
        self.values = array("f", bytes(4 * size * _SLOTS))
        self.added = array("L", bytes(array("L").itemsize * _SLOTS))

    def add(self, warmth: str, startup: float, run: float) -> None:
        for measure, value in (("startup", startup), ("run", run)):
            slot = _INDEX[warmth, measure]
            count = self.added[slot]
            self.values[slot * self.size + count % self.size] = value
            self.added[slot] = count + 1

    def of(self, warmth: str, measure: str) -> list[float]:
        slot = _INDEX[warmth, measure]
        held = min(self.added[slot], self.size)
        start = slot * self.size
        return list(self.values[start : start + held])

    def runs(self, warmth: str) -> int:
        """Runs of `warmth` ever added (not only those kept)."""
        return int(self.added[_INDEX[warmth, "startup"]])

    def __bool__(self) -> bool:
        return any(self.added)


@dataclass(frozen=True)
class Difference:
    """Median of other runs less median of exact runs, with its interval."""

    seconds: float
    low: float
    high: float
    exact: int  # samples on each side
    other: int

    @property
    def measurable(self) -> bool:
        """The interval excludes 0, with at least MIN_RUNS values on each side (an
        order-statistic interval of fewer is too wide or too narrow to trust)."""
        return self.comparisons >= MIN_RUNS and (self.low > 0 or self.high < 0)

    @property
    def comparisons(self) -> int:
        return min(self.exact, self.other)


def median_interval(values: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """A distribution-free interval of the median, about 95 % for z 1.96: the order
    statistics at ranks n/2 -+ z sqrt(n)/2 (the extremes for few values)."""
    ordered = sorted(values)
    n = len(ordered)
    half = z * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half))
    high = min(n - 1, math.ceil(n / 2 + half) - 1)
    return ordered[low], ordered[high]


def difference(
    exact: Sequence[float], other: Sequence[float], z: float = Z95
) -> Difference | None:
    """`other`'s median less `exact`'s, None unless both have values."""
    if not exact or not other:
        return None
    exact_low, exact_high = median_interval(exact, z)
    other_low, other_high = median_interval(other, z)
    return Difference(
        seconds=statistics.median(other) - statistics.median(exact),
        low=other_low - exact_high,
        high=other_high - exact_low,
        exact=len(exact),
        other=len(other),
    )


def difference_over(
    samples: Samples, measure: str, others: Sequence[str]
) -> Difference | None:
    """The median `measure` of the runs of the classes `others` less that of the
    exact runs, with its interval; None unless both have samples."""
    other = [value for warmth in others for value in samples.of(warmth, measure)]
    z = Z_RUN if measure == "run" else Z95
    return difference(samples.of("exact", measure), other, z)


def saved_seconds(startup: Difference | None, run: Difference | None) -> float | None:
    """The seconds an exact placement saves: startup, plus run when measurable."""
    if startup is None:
        return None
    if run is not None and run.measurable:
        return startup.seconds + run.seconds
    return startup.seconds


def savings(samples: Samples) -> dict[str, tuple[float, int]]:
    """other class -> (seconds an exact placement saves over it: startup, plus run
    when measurable; comparisons), for the classes with runs on both sides."""
    found = {}
    for other in OTHERS:
        startup = difference_over(samples, "startup", (other,))
        if startup is None:
            continue
        seconds = saved_seconds(startup, difference_over(samples, "run", (other,)))
        assert seconds is not None
        found[other] = (seconds, startup.comparisons)
    return found


def startup_comparisons(samples: Samples) -> int:
    """The fewer of the pipeline's exact and other runs (startups compared)."""
    side = difference_over(samples, "startup", OTHERS)
    return side.comparisons if side is not None else 0
