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
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence, Sized
from typing import Any

# One key's rows (as `model.KeyRows`): node -> (count, decayed_weight, decayed_at).
KeyRows = Mapping[str, tuple[int, float, float]]

# Epoch numbers are unique in the process, whichever store makes them.
_EPOCHS = itertools.count(1)
# A key's change log starts a new epoch beyond this many entries.
MAX_CHANGES = 20000
# Estimated bytes per entry of a derived mapping (a dict slot and a small int).
DERIVED_BYTES = 64
# Labels whose keys' scores are also kept combined (`KeyMemo.combined`), least
# recently used dropped first; a label is combined from its second call on. At most
# this many labels, and this many estimated bytes for all of them (a label whose
# keys cover 5 000 nodes takes about 320 KB).
MAX_COMBINED = 256
MAX_COMBINED_BYTES = 16 * 1024 * 1024
# Derived values kept per key, least recently used dropped first: a key's positions
# in labels times the strategies, and the `warm` time window each was built for (a
# new window makes the old one's values useless).
MAX_TAGS = 16


class KeyMemo:
    """Per key: its epoch, the nodes changed in it, and values derived from it."""

    def __init__(self) -> None:
        self.epochs: dict[str, int] = {}
        self.changes: dict[str, list[str]] = {}
        # key -> tag -> (epoch, changes seen, value, estimated bytes)
        self.derived: dict[str, dict[Hashable, tuple[int, int, Any, int]]] = {}
        # (keys, tag) -> (the keys' versions, node -> value, bytes)
        self.labels: OrderedDict[
            Hashable, tuple[tuple[tuple[int, int], ...], dict[str, int], int]
        ] = OrderedDict()
        self.sightings: OrderedDict[Hashable, None] = OrderedDict()
        self.labels_bytes = 0
        self.bytes = 0

    def clear(self) -> None:
        self.epochs.clear()
        self.changes.clear()
        self.derived.clear()
        self.labels.clear()
        self.sightings.clear()
        self.labels_bytes = 0
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
            del by_tag[tag]  # re-inserted last: most recently used
            if entry[1] < len(changes):
                update(value, rows, set(changes[entry[1] :]))
                size = _size(value)
                self.bytes += size - entry[3]
                entry = (epoch, len(changes), value, size)
            by_tag[tag] = entry
            return value
        value = build(rows)
        size = _size(value)
        if entry is not None:
            self.bytes -= entry[3]
            del by_tag[tag]
        while len(by_tag) >= MAX_TAGS:
            oldest = next(iter(by_tag))
            self.bytes -= by_tag.pop(oldest)[3]
        self.bytes += size
        by_tag[tag] = (epoch, len(changes), value, size)
        return value

    def versions(self, keys: Sequence[str]) -> tuple[tuple[int, int], ...]:
        return tuple(self.version(key) for key in keys)

    def combined(
        self,
        keys: Sequence[str],
        tag: Hashable,
        versions: tuple[tuple[int, int], ...],
        maps: Callable[[], Sequence[Mapping[str, int]]],
    ) -> dict[str, int] | None:
        """node -> its value in the last of the keys' mappings (`maps()`, derived
        from `keys` general to specific) that has it, kept per label from its second
        call on (None before), and brought up to date node by node while the keys'
        epochs last. `versions` are the keys' versions when `maps()` is current."""
        ident = (tuple(keys), tag)
        entry = self.labels.get(ident)
        if entry is None:
            if ident not in self.sightings:
                self.sightings[ident] = None
                if len(self.sightings) > MAX_COMBINED:
                    self.sightings.popitem(last=False)
                return None
            del self.sightings[ident]
            value: dict[str, int] = {}
            for mapping in maps():
                value.update(mapping)
            self._keep_label(ident, versions, value, None)
            return value
        self.labels.move_to_end(ident)
        seen, value, _ = entry
        if seen == versions:
            return value
        if any(old[0] != new[0] for old, new in zip(seen, versions, strict=True)):
            value = {}
            for mapping in maps():
                value.update(mapping)
        else:
            changed: set[str] = set()
            for key, old, new in zip(keys, seen, versions, strict=True):
                if old != new:
                    changed.update(self.changes[key][old[1] : new[1]])
            found = list(reversed(maps()))
            for node in changed:
                for mapping in found:
                    score = mapping.get(node)
                    if score is not None:
                        value[node] = score
                        break
                else:
                    value.pop(node, None)
        self._keep_label(ident, versions, value, entry)
        return value

    def _keep_label(
        self,
        ident: Hashable,
        versions: tuple[tuple[int, int], ...],
        value: dict[str, int],
        entry: tuple[Any, Any, int] | None,
    ) -> None:
        if entry is not None:
            self.bytes -= entry[2]
            self.labels_bytes -= entry[2]
        size = _size(value)
        self.bytes += size
        self.labels_bytes += size
        self.labels[ident] = (versions, value, size)
        while len(self.labels) > 1 and (
            len(self.labels) > MAX_COMBINED or self.labels_bytes > MAX_COMBINED_BYTES
        ):
            dropped = self.labels.popitem(last=False)[1][2]
            self.bytes -= dropped
            self.labels_bytes -= dropped

    def _drop_derived(self, key: str) -> None:
        for entry in self.derived.pop(key, {}).values():
            self.bytes -= entry[3]


def _size(value: Any) -> int:
    return (len(value) if isinstance(value, Sized) else 1) * DERIVED_BYTES
