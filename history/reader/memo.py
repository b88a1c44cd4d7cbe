"""Where a store's per-key data stands, and what callers derive from it.

A store that keeps history between reads (the per-worker caches, the simulator's
memory) gives each key an epoch and a log of the nodes whose rows changed in it.
`KeyMemo` keeps, per key, whatever a caller derived from that key's rows (the
strategies keep each key's node scores): a derived value is brought up to date by
re-examining only the nodes changed since, and rebuilt when the key starts a new
epoch. It is the one home of derived data in ks-scheduler; the strategies are pure
functions of a `LabelHistory` and ask it through `LabelHistory.derive`.

Memory is counted in estimated bytes (entries times `DERIVED_BYTES`) and bounded by
the owning store, which drops a key's derived values with its rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sized
from typing import Any

# One key's rows (as `model.KeyRows`): node -> (count, decayed_weight, decayed_at).
KeyRows = Mapping[str, tuple[int, float, float]]

# Epoch numbers are unique in the process, whichever store makes them.
_EPOCHS = itertools.count(1)
# A key's change log starts a new epoch beyond this many entries.
MAX_CHANGES = 20000
# Estimated bytes per entry of a derived mapping (a dict slot and a small int).
DERIVED_BYTES = 64


class KeyMemo:
    """Per key: its epoch, the nodes changed in it, and values derived from it."""

    def __init__(self) -> None:
        self.epochs: dict[str, int] = {}
        self.changes: dict[str, list[str]] = {}
        # key -> tag -> (epoch, changes seen, value, estimated bytes)
        self.derived: dict[str, dict[Hashable, tuple[int, int, Any, int]]] = {}
        self.bytes = 0

    def clear(self) -> None:
        self.epochs.clear()
        self.changes.clear()
        self.derived.clear()
        self.bytes = 0

    def start(self, key: str) -> None:
        """The key's rows were (re)loaded: what was derived from them is gone."""
        self.epochs[key] = next(_EPOCHS)
        self.changes[key] = []
        self._drop_derived(key)

    def forget(self, key: str) -> None:
        """The store dropped the key."""
        self.epochs.pop(key, None)
        self.changes.pop(key, None)
        self._drop_derived(key)

    def restart_all(self) -> None:
        """Something every derived value depends on changed (node replacements)."""
        for key in list(self.epochs):
            self.start(key)

    def changed(self, key: str, nodes: Iterable[str]) -> None:
        """These nodes' rows of `key` changed."""
        changes = self.changes.get(key)
        if changes is None:
            return
        changes.extend(nodes)
        if len(changes) > MAX_CHANGES:
            self.start(key)

    def version(self, key: str) -> tuple[int, int]:
        return self.epochs.get(key, 0), len(self.changes.get(key, ()))

    def derive(
        self,
        key: str,
        tag: Hashable,
        rows: KeyRows,
        build: Callable[[KeyRows], Any],
        update: Callable[[Any, KeyRows, set[str]], None],
    ) -> Any:
        """`build(rows)`, kept per (key, tag) and brought up to date with
        `update(value, rows, changed nodes)` while the key's epoch lasts."""
        epoch = self.epochs.get(key)
        if epoch is None:
            return build(rows)
        changes = self.changes[key]
        by_tag = self.derived.setdefault(key, {})
        entry = by_tag.get(tag)
        if entry is not None and entry[0] == epoch:
            value = entry[2]
            if entry[1] < len(changes):
                update(value, rows, set(changes[entry[1] :]))
                size = _size(value)
                self.bytes += size - entry[3]
                by_tag[tag] = (epoch, len(changes), value, size)
            return value
        value = build(rows)
        size = _size(value)
        if entry is not None:
            self.bytes -= entry[3]
        self.bytes += size
        by_tag[tag] = (epoch, len(changes), value, size)
        return value

    def _drop_derived(self, key: str) -> None:
        for entry in self.derived.pop(key, {}).values():
            self.bytes -= entry[3]


def _size(value: Any) -> int:
    return (len(value) if isinstance(value, Sized) else 1) * DERIVED_BYTES
