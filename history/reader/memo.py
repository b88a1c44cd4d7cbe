"""What callers derive from a key's rows, kept between reads and shared by every
thread and greenlet of the process.

A store that keeps history between reads (the process cache, the simulator's
memory) tells `KeyMemo` when a key's rows were loaded (`start`: a new epoch) and
which nodes changed since (`changed`). A read hands out a `MemoView`: the memo and
the version, (epoch, changes seen), of each key's rows in that read. The strategies
ask it through `LabelHistory.derive` with a rule per node (a pure function of one
node's row: a value to keep, None, or UNSETTLED) and get `NodeValues`; they never
see a version or a change: the memo applies the rule to every row once, then again
only to the nodes changed since, and to every row when the key starts a new epoch.

**Lending.** Every read's `MemoView` is registered while it lives (`lent`). Values
held by a read are never changed under it: while another read's view lives, an
update makes new `NodeValues` (or a new combined mapping), and values are stored
only if they are at least as recent as the ones they replace. A read alone (the
extender's serial calls) updates them in place, under `lock`, at the cost of the
nodes that changed rather than of the nodes the key holds; the store does the same
with its rows. Every access takes `lock` briefly; a rule applied to every row runs
outside it.

Memory is counted in estimated bytes (entries times `DERIVED_BYTES`) and bounded by
the owning store, which drops a key's derived values with its rows.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence, Set
from dataclasses import dataclass
from enum import Enum

# One key's rows (as `model.KeyRows`): node -> (count, decayed_weight, decayed_at).
KeyRows = Mapping[str, tuple[int, float, float]]
# A key's version: (epoch, changes seen).
Version = tuple[int, int]

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
# in labels times the strategies, and the `warm` time window each was built for.
MAX_TAGS = 16


class Unsettled(Enum):
    """A rule's answer for a node whose value cannot be kept (worked out per call)."""

    NODE = "unsettled"


UNSETTLED = Unsettled.NODE
# A rule per node: its value from its row of one key (None: nothing to keep).
NodeRule = Callable[[str, tuple[int, float, float]], int | None | Unsettled]


@dataclass(frozen=True, slots=True)
class NodeValues:
    """A rule applied to one key's rows: node -> value for the nodes it gave one,
    and the nodes it could not settle. Never changed once made."""

    values: dict[str, int]
    unsettled: set[str]

    @property
    def size(self) -> int:
        return (len(self.values) + len(self.unsettled)) * DERIVED_BYTES


def apply_rule(rule: NodeRule, rows: KeyRows) -> NodeValues:
    """`rule` on every row."""
    values: dict[str, int] = {}
    unsettled: set[str] = set()
    for node, row in rows.items():
        value = rule(node, row)
        if value is UNSETTLED:
            unsettled.add(node)
        elif value is not None:
            values[node] = value
    return NodeValues(values, unsettled)


def reapply_rule(
    rule: NodeRule,
    rows: KeyRows,
    old: NodeValues,
    changed: Set[str],
    *,
    in_place: bool = False,
) -> NodeValues:
    """`old` with `rule` applied again to the `changed` nodes' rows: new values, or
    `old` itself changed when `in_place`."""
    if in_place:
        values, unsettled = old.values, old.unsettled
    else:
        values, unsettled = dict(old.values), set(old.unsettled)
    for node in changed:
        values.pop(node, None)
        unsettled.discard(node)
        row = rows.get(node)
        if row is None:
            continue
        value = rule(node, row)
        if value is UNSETTLED:
            unsettled.add(node)
        elif value is not None:
            values[node] = value
    return old if in_place else NodeValues(values, unsettled)


@dataclass(slots=True)
class _Derived:
    version: Version
    value: NodeValues


@dataclass(slots=True)
class _Combined:
    versions: tuple[Version, ...]
    value: dict[str, int]
    size: int


class KeyMemo:
    """Per key: its epoch, the nodes changed in it, and values derived from it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._next_epoch = 0
        self.epochs: dict[str, int] = {}
        self.changes: dict[str, list[str]] = {}
        # key -> tag -> the latest value derived from the key's rows
        self.derived: dict[str, dict[Hashable, _Derived]] = {}
        # (keys, tag) -> a label's combined value; labels seen once
        self.labels: OrderedDict[Hashable, _Combined] = OrderedDict()
        self.sightings: OrderedDict[Hashable, None] = OrderedDict()
        self.labels_bytes = 0
        self.bytes = 0
        # The views of the reads alive (see "Lending").
        self.views: weakref.WeakSet[MemoView] = weakref.WeakSet()

    def clear(self) -> None:
        with self.lock:
            self.epochs.clear()
            self.changes.clear()
            self.derived.clear()
            self.labels.clear()
            self.sightings.clear()
            self.labels_bytes = 0
            self.bytes = 0

    # --- what the store tells ------------------------------------------------------

    def start(self, key: str) -> None:
        """The key's rows were (re)loaded: what was derived from them is gone."""
        with self.lock:
            self._start(key)

    def forget(self, key: str) -> None:
        """The store dropped the key."""
        with self.lock:
            self.epochs.pop(key, None)
            self.changes.pop(key, None)
            self._drop_derived(key)

    def restart_all(self) -> None:
        """Something every derived value depends on changed (node replacements)."""
        with self.lock:
            for key in list(self.epochs):
                self._start(key)

    def changed(self, key: str, nodes: Sequence[str]) -> None:
        """These nodes' rows of `key` changed."""
        with self.lock:
            changes = self.changes.get(key)
            if changes is None:
                return
            changes.extend(nodes)
            if len(changes) > MAX_CHANGES:
                self._start(key)

    def view(self, keys: Sequence[str]) -> MemoView:
        """The versions of `keys` now, for a read that hands out their rows now
        (keys the memo does not hold are left out: nothing is kept for them)."""
        with self.lock:
            versions = {
                key: (epoch, len(self.changes[key]))
                for key in keys
                if (epoch := self.epochs.get(key)) is not None
            }
            view = MemoView(self, versions)
            self.views.add(view)
        return view

    def lent(self) -> bool:
        """Whether a read's view is alive: what it was handed must not change."""
        with self.lock:
            return len(self.views) > 0

    def _alone(self, view: MemoView | None) -> bool:
        """Whether `view` is the only read alive (under `lock`)."""
        return view is not None and len(self.views) == 1 and view in self.views

    # --- what readers ask -----------------------------------------------------------

    def derive(
        self,
        key: str,
        version: Version,
        tag: Hashable,
        rows: KeyRows,
        rule: NodeRule,
        view: MemoView | None = None,
    ) -> NodeValues:
        """`rule` applied to `rows`, or the values kept for (key, tag) brought up to
        `version` (that of `rows`) by applying it to the nodes changed since (in
        place when `view`'s read is the only one alive)."""
        epoch, seen = version
        with self.lock:
            if self.epochs.get(key) != epoch:
                old = None
            else:
                entry = self.derived.get(key, {}).get(tag)
                old = entry if entry is not None and entry.version[0] == epoch else None
                if old is not None and old.version[1] == seen:
                    return old.value
                if old is not None and old.version[1] < seen:
                    changed = set(self.changes[key][old.version[1] : seen])
                    if self._alone(view):
                        size = old.value.size
                        reapply_rule(rule, rows, old.value, changed, in_place=True)
                        old.version = version
                        self.bytes += old.value.size - size
                        return old.value
                else:
                    old = None
        if old is None:
            value = apply_rule(rule, rows)
        else:
            value = reapply_rule(rule, rows, old.value, changed)
        with self.lock:
            self._keep(key, version, tag, value)
        return value

    def combined(
        self,
        keys: Sequence[str],
        versions: tuple[Version, ...],
        tag: Hashable,
        maps: Sequence[Mapping[str, int]],
        view: MemoView | None = None,
    ) -> Mapping[str, int] | None:
        """node -> its value in the last of `maps` (derived from `keys` general to
        specific, at `versions`) that has it, kept per label from its second call on
        (None before) and brought up to date node by node while the keys' epochs
        last (in place when `view`'s read is the only one alive)."""
        ident = (tuple(keys), tag)
        with self.lock:
            entry = self.labels.get(ident)
            if entry is None:
                if ident not in self.sightings:
                    self.sightings[ident] = None
                    if len(self.sightings) > MAX_COMBINED:
                        self.sightings.popitem(last=False)
                    return None
                del self.sightings[ident]
            else:
                self.labels.move_to_end(ident)
                if entry.versions == versions:
                    return entry.value
            changed = self._changed_between(keys, entry, versions)
            if changed is not None and entry is not None and self._alone(view):
                _update_combined(entry.value, changed, maps)
                entry.versions = versions
                self.bytes -= entry.size
                self.labels_bytes -= entry.size
                entry.size = len(entry.value) * DERIVED_BYTES
                self.bytes += entry.size
                self.labels_bytes += entry.size
                return entry.value
        if changed is None:
            value: dict[str, int] = {}
            for mapping in maps:
                value.update(mapping)
        else:
            assert entry is not None
            value = dict(entry.value)
            _update_combined(value, changed, maps)
        with self.lock:
            self._keep_label(ident, versions, value)
        return value

    # --- under the lock -------------------------------------------------------------

    def _start(self, key: str) -> None:
        self._next_epoch += 1
        self.epochs[key] = self._next_epoch
        self.changes[key] = []
        self._drop_derived(key)

    def _keep(
        self, key: str, version: Version, tag: Hashable, value: NodeValues
    ) -> None:
        if self.epochs.get(key) != version[0]:
            return
        by_tag = self.derived.setdefault(key, {})
        entry = by_tag.pop(tag, None)
        if entry is not None:
            if entry.version[0] == version[0] and entry.version[1] > version[1]:
                by_tag[tag] = entry  # a newer one is kept already
                return
            self.bytes -= entry.value.size
        while len(by_tag) >= MAX_TAGS:
            self.bytes -= by_tag.pop(next(iter(by_tag))).value.size
        self.bytes += value.size
        by_tag[tag] = _Derived(version, value)

    def _changed_between(
        self,
        keys: Sequence[str],
        entry: _Combined | None,
        versions: tuple[Version, ...],
    ) -> set[str] | None:
        """The nodes changed in `keys` from the entry's versions to `versions`, or
        None when the value must be built again."""
        if entry is None:
            return None
        changed: set[str] = set()
        for key, old, new in zip(keys, entry.versions, versions, strict=True):
            if old[0] != new[0] or old[1] > new[1] or self.epochs.get(key) != new[0]:
                return None
            changed.update(self.changes[key][old[1] : new[1]])
        return changed

    def _keep_label(
        self, ident: Hashable, versions: tuple[Version, ...], value: dict[str, int]
    ) -> None:
        entry = self.labels.pop(ident, None)
        if entry is not None:
            self.bytes -= entry.size
            self.labels_bytes -= entry.size
        size = len(value) * DERIVED_BYTES
        self.bytes += size
        self.labels_bytes += size
        self.labels[ident] = _Combined(versions, value, size)
        while len(self.labels) > 1 and (
            len(self.labels) > MAX_COMBINED or self.labels_bytes > MAX_COMBINED_BYTES
        ):
            dropped = self.labels.popitem(last=False)[1].size
            self.bytes -= dropped
            self.labels_bytes -= dropped

    def _drop_derived(self, key: str) -> None:
        for entry in self.derived.pop(key, {}).values():
            self.bytes -= entry.value.size


def _update_combined(
    value: dict[str, int], changed: Set[str], maps: Sequence[Mapping[str, int]]
) -> None:
    """A label's combined `value` with the `changed` nodes looked up again."""
    found = list(reversed(maps))
    for node in changed:
        for mapping in found:
            score = mapping.get(node)
            if score is not None:
                value[node] = score
                break
        else:
            value.pop(node, None)


class MemoView:
    """The memo as one read sees it: each key's version when its rows were handed
    out, registered with the memo while it lives (see "Lending"). Callers go through
    `LabelHistory.derive` and `LabelHistory.combined`."""

    __slots__ = ("memo", "versions", "__weakref__")

    def __init__(self, memo: KeyMemo, versions: Mapping[str, Version]):
        self.memo = memo
        self.versions = versions

    def derive(
        self, key: str, tag: Hashable, rows: KeyRows, rule: NodeRule
    ) -> NodeValues:
        version = self.versions.get(key)
        if version is None:
            return apply_rule(rule, rows)
        return self.memo.derive(key, version, tag, rows, rule, self)

    def combined(
        self, keys: Sequence[str], tag: Hashable, maps: Sequence[Mapping[str, int]]
    ) -> Mapping[str, int] | None:
        versions = [self.versions.get(key) for key in keys]
        if any(version is None for version in versions):
            return None
        return self.memo.combined(
            keys, tuple(v for v in versions if v is not None), tag, maps, self
        )
