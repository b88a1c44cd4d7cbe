"""What the per-worker history caches share: the rows of the keys asked about, each
label's rows by node with its change log, and the small tables without a ledger.

A store's cache (`sqlite_cache`, `postgres_cache`) only says what changed since its
last look (`sync`): the (key, node) pairs to re-read, whether the small tables must
be re-read, or that everything must start over. Re-reading is idempotent, so a
change seen twice does no harm; a change never seen would, and each store explains
why none is missed.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from django.db import connection

from history.models import KeyNode, KeyPolicy, NodePolicy, NodeRecord, Placement
from history.reader.model import LabelHistory, Policies, Revision
from history.reader.sql import (
    NULL_NUMBER,
    NULL_REAL,
    NULL_TEXT,
    SqlReader,
    as_timestamp,
)
from history.recency import Row

# Bounds on memory: beyond these, the cache starts again from empty.
MAX_KEYS = 512
MAX_LABELS = 256
# A sync that names more pairs than this starts over instead (bulk edits, pauses).
MAX_SYNC_PAIRS = 5000
# A label's change log starts a new epoch beyond this many entries.
MAX_CHANGES = 20000

# Epoch numbers are unique in the process, whichever thread's cache makes them.
_EPOCHS = itertools.count(1)


class _Label:
    """One label's rows by node, with the log of nodes whose rows changed."""

    __slots__ = ("keys", "unique", "rows", "epoch", "changes")

    def __init__(self, keys: tuple[str, ...]):
        self.keys = keys
        self.unique = tuple(dict.fromkeys(keys))
        self.rows: dict[str, list[Row]] = {}
        self.new_epoch()

    def new_epoch(self) -> None:
        self.epoch = next(_EPOCHS)
        self.changes: list[str] = []


class CachedReader:
    """The history of the labels asked about, kept up to date by `sync`.

    Inside a transaction it answers through `SqlReader` instead: an uncommitted
    write could be rolled back after being cached.
    """

    max_changes = MAX_CHANGES

    def __init__(self) -> None:
        self.sql = SqlReader()
        self.clear()

    def clear(self) -> None:
        """Forget everything; the next read loads what it needs."""
        # key -> {node: (count, decayed_weight, decayed_at)} for count > 0
        self.rows: dict[str, dict[str, tuple[int, float, float]]] = {}
        self.labels: dict[tuple[str, ...], _Label] = {}
        # Tables without a ledger, re-read when `sync` says they changed.
        self.extra_stale = True
        self.active: dict[str, dict[str, int]] = {}
        self.busy: dict[str, int] = {}
        self.policies = Policies()
        self.replaced: dict[str, float] = {}

    def sync(self) -> None:
        """Bring the cache up to date: call `changed`, `extra_changed`, `clear`."""
        raise NotImplementedError

    def look_ahead(self) -> None:
        """Start the next `sync` now, if this store can (see `reading_ahead`)."""

    def settle(self) -> None:
        """Finish what `look_ahead` started if no `sync` did."""

    def after_request(self) -> None:
        """Housekeeping that can wait until a request's reply is sent."""

    def read(
        self, *, keys: Sequence[str], label: str, nodes: Sequence[str] | None
    ) -> LabelHistory:
        """The label's history on every node that has some (see `LabelHistory`)."""
        if connection.in_atomic_block:
            return self.sql.read(keys=keys, label=label, nodes=nodes)
        self.sync()
        if self.extra_stale:
            self._read_extra()
        state = self._label(tuple(keys))
        return LabelHistory(
            keys=state.keys,
            rows=state.rows,
            replaced=self.replaced,
            active=self.active.get(label, {}),
            busy=self.busy,
            policies=self.policies,
            revision=Revision(epoch=state.epoch, changes=state.changes),
        )

    # --- what `sync` reports --------------------------------------------------------

    def is_cached(self, key: str) -> bool:
        return key in self.rows

    def changed(self, pairs: Mapping[str, set[str]]) -> None:
        """Re-read the rows of these (key, nodes) pairs; keys not cached are skipped."""
        for key, nodes in pairs.items():
            if key in self.rows and nodes:
                self._reread(key, sorted(nodes))

    def extra_changed(self) -> None:
        """The ledger's active rows, the policies or the node records changed."""
        self.extra_stale = True

    # --- labels ---------------------------------------------------------------------

    def _label(self, keys: tuple[str, ...]) -> _Label:
        state = self.labels.get(keys)
        if state is not None:
            return state
        missing = [key for key in dict.fromkeys(keys) if key not in self.rows]
        if len(self.labels) >= MAX_LABELS or len(self.rows) + len(missing) > MAX_KEYS:
            self.rows.clear()
            self.labels.clear()
            missing = list(dict.fromkeys(keys))
        self._load_rows(missing)
        state = self.labels[keys] = _Label(keys)
        for node in {node for key in state.unique for node in self.rows[key]}:
            self._set_node(state, node)
        return state

    def _load_rows(self, keys: list[str]) -> None:
        """Every row with count > 0 of `keys`, in one query."""
        if not keys:
            return
        for key in keys:
            self.rows[key] = {}
        marks = ", ".join(["%s"] * len(keys))
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT key, node, count, decayed_weight, decayed_at "
                f"FROM {KeyNode._meta.db_table} WHERE key IN ({marks}) AND count > 0",
                keys,
            )
            for key, node, count, weight, at in cursor.fetchall():
                self.rows[key][node] = (count, weight, at)

    def _set_node(self, state: _Label, node: str) -> None:
        rows = [
            (key, *row)
            for key in state.unique
            if (row := self.rows[key].get(node)) is not None
        ]
        if rows:
            state.rows[node] = rows
        else:
            state.rows.pop(node, None)

    def _reread(self, key: str, nodes: list[str]) -> None:
        marks = ", ".join(["%s"] * len(nodes))
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT node, count, decayed_weight, decayed_at "
                f"FROM {KeyNode._meta.db_table} "
                f"WHERE key = %s AND node IN ({marks})",
                [key, *nodes],
            )
            found = {node: (count, weight, at) for node, count, weight, at in cursor}
        cached = self.rows[key]
        for node in nodes:
            row = found.get(node)
            if row is not None and row[0] > 0:
                cached[node] = row
            else:
                cached.pop(node, None)
        for state in self.labels.values():
            if key in state.unique:
                if len(state.changes) + len(nodes) > self.max_changes:
                    state.new_epoch()
                for node in nodes:
                    self._set_node(state, node)
                state.changes.extend(nodes)

    def _read_extra(self) -> None:
        """Active pods, policies and node replacements: small tables without a
        ledger, read in one statement."""
        active: dict[str, dict[str, int]] = {}
        busy: dict[str, int] = {}
        key_policies: dict[str, tuple[bool, float]] = {}
        node_policies: dict[str, dict[str, str]] = {}
        replaced: dict[str, float] = {}
        text, number, real = NULL_TEXT, NULL_NUMBER, NULL_REAL
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 0, node, label, {text}, COUNT(*), {real} "
                f"FROM {Placement._meta.db_table} "
                f"WHERE finished_at IS NULL GROUP BY node, label "
                f"UNION ALL SELECT 1, key, {text}, {text}, "
                f"CASE WHEN enabled THEN 1 ELSE 0 END, weight "
                f"FROM {KeyPolicy._meta.db_table} "
                f"UNION ALL SELECT 2, key, node, action, {number}, {real} "
                f"FROM {NodePolicy._meta.db_table} "
                f"UNION ALL SELECT 3, name, CAST(history_since AS TEXT), {text}, "
                f"{number}, {real} FROM {NodeRecord._meta.db_table} "
                f"WHERE replacements > 0 AND history_since IS NOT NULL"
            )
            rows = cursor.fetchall()
        for kind, first, second, third, number_, real_ in rows:
            if kind == 0:
                active.setdefault(second, {})[first] = number_
                busy[first] = busy.get(first, 0) + number_
            elif kind == 1:
                key_policies[first] = (bool(number_), float(real_))
            elif kind == 2:
                node_policies.setdefault(first, {})[second] = third
            else:
                replaced[first] = as_timestamp(second)
        self.active, self.busy = active, busy
        policies = Policies(keys=key_policies, nodes=node_policies)
        if policies != self.policies or replaced != self.replaced:
            # What readers derived from the rows no longer holds: a new epoch.
            self.policies, self.replaced = policies, replaced
            for state in self.labels.values():
                state.new_epoch()
        self.extra_stale = False
