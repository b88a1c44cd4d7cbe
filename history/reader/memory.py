"""History kept in memory, updated as the database is: the simulator's store.

Placing a pod adds to its keys' rows exactly as the ledger's upsert does
(`recency.accumulate_decayed`), so the strategies score a simulated cluster through
the same `LabelHistory` they get from the database. Like the process cache it keeps
what the strategies derive per key (`memo.KeyMemo`), told of every change. It
belongs to one thread (the simulator's): its mappings change in place.
"""

from __future__ import annotations

from collections.abc import Sequence

from history.labels import distinct_keys, path_keys, placement_keys
from history.reader.depths import DEEPEST, depths_of, pipeline_key, ran_on
from history.reader.memo import KeyMemo
from history.reader.model import LabelHistory, Policies
from history.reader.pool import Pool
from history.recency import accumulate_decayed


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
        self.memo = KeyMemo()
        # node -> when the watcher first saw it (Unix seconds)
        self.seen: dict[str, float] = {}
        # node -> its recent pipelines' keys, most recent first (`depths`)
        self.recent: dict[str, list[str]] = {}
        self.pipeline_pool = Pool(self._read_pool)

    def pool(self, *, now: float, days: float) -> tuple[str, ...]:
        """The pipeline pool, as `pool.read_pool` reads it from the database."""
        return self.pipeline_pool.at(now=now, days=days)

    def _read_pool(self, since: float) -> list[str]:
        placed = {
            node
            for by_node in self.rows.values()
            for node, (count, _, at) in by_node.items()
            if count > 0 and at >= since
        }
        seen = {node for node, at in self.seen.items() if at >= since}
        replaced = {node for node, at in self.replaced.items() if at >= since}
        return sorted(placed | seen | replaced)

    def place(self, *, label: str, node: str, now: float) -> None:
        """Count one pod of `label` on `node` at `now`, under every key the ledger
        counts it under (`labels.placement_keys`)."""
        for key in placement_keys(label):
            count, weight, at = self.rows.setdefault(key, {}).get(node, (0, 0.0, 0.0))
            weight, at = accumulate_decayed(
                weight=weight, at=at, add=1.0, add_at=now, half_life=self.half_life
            )
            self.rows[key][node] = (count + 1, weight, at)
            self.memo.changed(key, (node,))
        if own := pipeline_key(path_keys(label)):
            recent = self.recent.setdefault(node, [])
            if own in recent:
                recent.remove(own)
            recent.insert(0, own)
            del recent[DEEPEST + 1 :]
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
        self.recent.pop(node, None)
        self.memo.restart_all()

    def read(
        self,
        *,
        keys: Sequence[str],
        label: str,
        nodes: Sequence[str] | None,
        depths: bool = False,
    ) -> LabelHistory:
        """The label's history (see `LabelHistory`): every node of its keys,
        whatever `nodes` asks about. Write rows through `place` once the store has
        been read: a row written straight into `rows` then is not seen by what the
        strategies keep per key."""
        unique = distinct_keys(keys)
        for key in unique:
            if key not in self.memo.epochs:
                self.memo.start(key)
        own = pipeline_key(unique) if depths else None
        ran = ran_on(self.rows.get(own, {}), self.replaced) if own else []
        return LabelHistory(
            keys=tuple(keys),
            by_key={key: self.rows.get(key, {}) for key in unique},
            replaced=self.replaced,
            active=self.active.get(label, {}),
            busy=self.busy,
            policies=self.policies,
            memo=self.memo.view(unique),
            depths=depths_of(own, ran, self.recent) if own else {},
        )
