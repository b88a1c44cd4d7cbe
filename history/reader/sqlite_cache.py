"""An exact per-thread copy of the history that SQLite workers score from.

A prioritize call for 5000 nodes and a four-segment label reads about 12 000 KeyNode
rows; on SQLite that query alone takes about 10 ms, five times what parsing and
answering the request costs. So each web worker keeps, for the keys it has been
asked about, every node's row in memory, and brings it up to date before each
answer.

It knows what changed from the ledger: every write to a KeyNode count goes with a
new Placement or CountAdjustment row in the same transaction (the invariant
`audit_counts` checks). Before each read it asks SQLite whether anything was
committed (`PRAGMA data_version` for other connections, `total_changes` for its
own); if so it reads the ledger rows added since the last look and re-reads the
rows of the (key, node) pairs they name. Re-reading is idempotent, so a commit that
lands while it syncs is picked up on the next call. SQLite commits one writer at a
time, so ledger ids become visible in order and none is skipped. Active pods,
policies and node replacements have no ledger: they are re-read, in one statement,
whenever SQLite reports any commit (finishing a pod is an UPDATE, so it is seen).

Inside a transaction it answers through `SqlReader` instead: an uncommitted write
could be rolled back after being cached.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

from django.db import connection

from history.labels import split_pipeline_label
from history.models import (
    CountAdjustment,
    KeyNode,
    KeyPolicy,
    NodePolicy,
    NodeRecord,
    Placement,
)
from history.reader.model import LabelHistory, Policies, Revision
from history.reader.sql import SqlReader, as_timestamp
from history.recency import Row

logger = logging.getLogger(__name__)

# Bounds on memory: beyond these, the cache starts again from empty.
MAX_KEYS = 512
MAX_LABELS = 256
# A sync that names more pairs than this reloads instead (bulk edits, long pauses).
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


class SqliteCacheReader:
    """The history of the labels asked about, for one database connection."""

    def __init__(self) -> None:
        self.sql = SqlReader()
        self.reset(None)

    def reset(self, raw) -> None:
        self.raw = raw
        self.token: tuple[int, int] | None = None
        self.placement_id: int | None = None
        self.adjustment_id = 0
        # key -> {node: (count, decayed_weight, decayed_at)} for count > 0
        self.rows: dict[str, dict[str, tuple[int, float, float]]] = {}
        self.labels: dict[tuple[str, ...], _Label] = {}
        # Tables without a ledger, re-read whenever the database changed at all.
        self.extra_token: tuple[int, int] | None = None
        self.active: dict[str, dict[str, int]] = {}
        self.busy: dict[str, int] = {}
        self.policies = Policies()
        self.replaced: dict[str, float] = {}

    def read(
        self, *, keys: Sequence[str], label: str, nodes: Sequence[str] | None
    ) -> LabelHistory:
        """The label's history on every node that has some (see `LabelHistory`)."""
        if connection.in_atomic_block:
            return self.sql.read(keys=keys, label=label, nodes=nodes)
        self._refresh()
        if self.extra_token != self.token:
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

    # --- labels -------------------------------------------------------------------

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

    def _read_extra(self) -> None:
        """Active pods, policies and node replacements: small, unledgered tables,
        read in one statement."""
        active: dict[str, dict[str, int]] = {}
        busy: dict[str, int] = {}
        key_policies: dict[str, tuple[bool, float]] = {}
        node_policies: dict[str, dict[str, str]] = {}
        replaced: dict[str, float] = {}
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 0, node, label, COUNT(*), NULL "
                f"FROM {Placement._meta.db_table} "
                f"WHERE finished_at IS NULL GROUP BY node, label "
                f"UNION ALL SELECT 1, key, NULL, enabled, weight "
                f"FROM {KeyPolicy._meta.db_table} "
                f"UNION ALL SELECT 2, key, node, action, NULL "
                f"FROM {NodePolicy._meta.db_table} "
                f"UNION ALL SELECT 3, name, history_since, NULL, NULL "
                f"FROM {NodeRecord._meta.db_table} "
                f"WHERE replacements > 0 AND history_since IS NOT NULL"
            )
            rows = cursor.fetchall()
        for kind, first, second, third, fourth in rows:
            if kind == 0:
                active.setdefault(second, {})[first] = third
                busy[first] = busy.get(first, 0) + third
            elif kind == 1:
                key_policies[first] = (bool(third), float(fourth))
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
        self.extra_token = self.token

    # --- keeping up to date -------------------------------------------------------

    def _refresh(self) -> None:
        connection.ensure_connection()
        raw = connection.connection
        if raw is not self.raw:
            self.reset(raw)
        # Asked on every call: straight on the sqlite3 connection, which costs a
        # tenth of a Django cursor (errors are still Django's).
        with connection.wrap_database_errors:
            version = raw.execute("PRAGMA data_version").fetchone()[0]
        token = (version, raw.total_changes)
        if token == self.token:
            return
        with connection.cursor() as cursor:
            if self.placement_id is None:
                self._mark(cursor)
            else:
                self._sync(cursor)
        self.token = token

    def _mark(self, cursor) -> None:
        """Remember where the ledger ends; rows read after this are current."""
        cursor.execute(f"SELECT MAX(id) FROM {Placement._meta.db_table}")
        self.placement_id = cursor.fetchone()[0] or 0
        cursor.execute(f"SELECT MAX(id) FROM {CountAdjustment._meta.db_table}")
        self.adjustment_id = cursor.fetchone()[0] or 0

    def _sync(self, cursor) -> None:
        """Re-read the rows of the pairs named by ledger rows added since."""
        cursor.execute(
            f"SELECT id, label, node FROM {Placement._meta.db_table} "
            f"WHERE id > %s ORDER BY id LIMIT %s",
            [self.placement_id, MAX_SYNC_PAIRS + 1],
        )
        placements = cursor.fetchall()
        cursor.execute(
            f"SELECT id, key, node FROM {CountAdjustment._meta.db_table} "
            f"WHERE id > %s ORDER BY id LIMIT %s",
            [self.adjustment_id, MAX_SYNC_PAIRS + 1],
        )
        adjustments = cursor.fetchall()
        if len(placements) > MAX_SYNC_PAIRS or len(adjustments) > MAX_SYNC_PAIRS:
            self.reset(self.raw)
            self._mark(cursor)
            return
        pairs: dict[str, set[str]] = {}
        for row_id, label, node in placements:
            self.placement_id = max(self.placement_id or 0, row_id)
            for key in split_pipeline_label(label):
                if key in self.rows:
                    pairs.setdefault(key, set()).add(node)
        for row_id, key, node in adjustments:
            self.adjustment_id = max(self.adjustment_id, row_id)
            if key in self.rows:
                pairs.setdefault(key, set()).add(node)
        for key, nodes in pairs.items():
            self._reread(cursor, key, sorted(nodes))

    def _reread(self, cursor, key: str, nodes: list[str]) -> None:
        marks = ", ".join(["%s"] * len(nodes))
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
                if len(state.changes) + len(nodes) > MAX_CHANGES:
                    state.new_epoch()
                for node in nodes:
                    self._set_node(state, node)
                state.changes.extend(nodes)
