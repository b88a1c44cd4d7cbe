"""What the simulator can run that production does not: the ceilings of what
knowledge could add to `warm`, and a rule under study.

* `TrueWorth`: every pipeline's worth known, not learned (strategy `oracle`).
* `held_only`: each node's cache contents known (strategy `oracle-cache`).
* `Recency`: the depth from which `warm` counts a node's own workspace gone
  (production's KSSCHED_WORKSPACE_DEPTH, `rules.workspace_gone`): LRU_DEPTH for
  strategy `lru`, and for `lru-learned` the depth read from the run's own outcomes
  so far, as `outcomes --workspaces` reads it from a ledger
  (`history.workspaces.depth_report`).

docs/scoring.md gives what each measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING, Any

from extender.scoring.rules import NO_HISTORY_SCORE
from history.workspaces import NodeOrder, depth_report
from history.worth import MIN_UNIT, Estimate, weight_for

if TYPE_CHECKING:
    from extender.scoring.scenarios import Workload

# Strategy `lru`: other pipelines run on a node since this one, at which its own
# workspace counts as gone. In the `worth` scenario 2 to 4 gain most; with 4 no
# scenario loses time saved over seeds 1-5 (docs/scoring.md).
LRU_DEPTH = 4
# Strategy `lru-learned`: ended pods between two readings of the depth.
READ_EVERY = 100


class TrueWorth:
    """What warmth is worth to each pipeline of a workload, known rather than learned:
    the `oracle` strategy, `warm` weighted as `adaptive` would be by a book that had
    learned every pipeline's worth perfectly from the start. It bounds what any
    estimate can add to the rule (`history.worth.weight_for`).

    A pipeline's saving is the median of its pods' cold extras; its worth is that in
    units of the median pipeline's, as `WorthBook.units` measures it."""

    def __init__(self, workload: Workload):
        extras: dict[str, list[float]] = {}
        for pod in workload.pods:
            extras.setdefault(pod.label, []).append(pod.cold_extra)
        self.saving = {label: statistics.median(v) for label, v in extras.items()}
        middle = statistics.median(self.saving.values()) if self.saving else 0.0
        self.unit = max(MIN_UNIT, middle)

    def estimate(self, label: str) -> Estimate:
        saving = self.saving.get(label)
        worth = None if saving is None else saving / self.unit
        return Estimate(
            label, {}, None, None, None, None, saving, worth, None, worth,
            {"cold": self.unit}, weight_for(worth), "the workload's own figure",
        )  # fmt: skip


def held_only(
    scores: list[int], caches: Sequence[Container[str]], keys: Sequence[str]
) -> list[int]:
    """`scores` with each node whose cache (in the same order) holds none of `keys`
    cut to the cold score, NO_HISTORY_SCORE: its warmth is gone, whatever its history
    says."""
    return [
        score if any(key in cache for key in keys) else min(score, NO_HISTORY_SCORE)
        for score, cache in zip(scores, caches, strict=True)
    ]


class Recency:
    """The order pipelines ran in on each node during a simulation run (what makes a
    placement exact for the report), and the depth from which `lru` counts a
    workspace gone: LRU_DEPTH, or with `learned` the depth the workspace report
    names from the pods ended so far (none named yet: no node is demoted, `warm` as
    it is)."""

    def __init__(self, *, learned: bool) -> None:
        self.order = NodeOrder()
        self.learned = learned
        self.depth: int | None = None if learned else LRU_DEPTH
        # The ledger as the report reads it: node, label, bound at, warmth (the
        # history's: exact when the pipeline ran on the node before), outcome,
        # startup, run.
        self.rows: list[list[Any]] = []
        self.unread = 0

    def placed(
        self, node: str, key: str, at: float, level: str, startup: float, run: float
    ) -> list[Any]:
        """Record a placement at `at` (`level`: the cache's warmth); returns its
        ledger row."""
        ran_before = self.order.place(node, key, at) is not None
        row = [node, key, at, "exact" if ran_before else level, "", startup, run]
        if self.learned:
            self.rows.append(row)
        return row

    def finished(self, row: list[Any]) -> None:
        if not self.learned:
            return
        row[4] = "Succeeded"
        self.unread += 1
        if self.unread >= READ_EVERY:
            self.unread = 0
            self.depth = depth_report(tuple(r) for r in self.rows)["gone_from"]
