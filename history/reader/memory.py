"""History kept in memory, updated as the database is: the simulator's store.

Placing a pod adds to its keys' rows exactly as the ledger's upsert does
(`recency.accumulate_decayed`), so the strategies score a simulated cluster through
the same `LabelHistory` they get from the database.
"""

from __future__ import annotations

from collections.abc import Sequence

from history.reader.model import LabelHistory, Policies
from history.recency import Row, accumulate_decayed


class MemoryHistory:
    """KeyNode rows, active pods, replacements and policies, in dicts."""

    def __init__(self, half_life: float):
        self.half_life = half_life
        # key -> node -> (count, decayed weight, decayed at)
        self.rows: dict[str, dict[str, tuple[int, float, float]]] = {}
        # label -> node -> active pods; node -> all active pods
        self.active: dict[str, dict[str, int]] = {}
        self.busy: dict[str, int] = {}
        self.replaced: dict[str, float] = {}
        self.policies = Policies()

    def place(self, *, keys: Sequence[str], label: str, node: str, now: float) -> None:
        """Count one pod of `label` (segments `keys`) on `node` at `now`."""
        for key in dict.fromkeys(keys):
            count, weight, at = self.rows.setdefault(key, {}).get(node, (0, 0.0, 0.0))
            weight, at = accumulate_decayed(
                weight=weight, at=at, add=1.0, add_at=now, half_life=self.half_life
            )
            self.rows[key][node] = (count + 1, weight, at)
        by_node = self.active.setdefault(label, {})
        by_node[node] = by_node.get(node, 0) + 1
        self.busy[node] = self.busy.get(node, 0) + 1

    def finish(self, *, label: str, node: str) -> None:
        """A pod of `label` on `node` ended; counts stay."""
        for counts, key in ((self.active[label], node), (self.busy, node)):
            counts[key] -= 1
            if not counts[key]:
                del counts[key]

    def replace(self, *, node: str, now: float) -> None:
        """`node` was replaced at `now`: its earlier history stops counting."""
        self.replaced[node] = now

    def read(
        self, *, keys: Sequence[str], label: str, nodes: Sequence[str] | None
    ) -> LabelHistory:
        """The label's history on `nodes`, or on every node with history for it
        (see `LabelHistory`)."""
        wanted = None if nodes is None else set(nodes)
        found: dict[str, list[Row]] = {}
        for key in dict.fromkeys(keys):
            for node, (count, weight, at) in self.rows.get(key, {}).items():
                if count > 0 and (wanted is None or node in wanted):
                    found.setdefault(node, []).append((key, count, weight, at))
        return LabelHistory(
            keys=tuple(keys),
            rows=found,
            replaced=self.replaced,
            active=self.active.get(label, {}),
            busy=self.busy,
            policies=self.policies,
        )
