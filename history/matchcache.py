"""A per-process copy of the KeyNode counts that prioritize reads, kept exact.

A prioritize call for 5000 nodes and a four-segment label reads about 12 000 KeyNode
rows; on SQLite that query alone takes about 10 ms, five times what parsing and
answering the request costs. So each web worker keeps, for the keys it has been asked
about, every node's count in memory and the best match per label, and brings them up
to date before each answer.

It knows what changed from the ledger: every write to a KeyNode count goes with a new
Placement or CountAdjustment row in the same transaction (the invariant
`audit_counts` checks). Before each use it asks SQLite whether anything was committed
(`PRAGMA data_version` for other connections, `total_changes` for its own); if so it
reads the ledger rows added since the last look and re-reads the counts of the
(key, node) pairs they name. Re-reading is idempotent, so a commit that lands while
it syncs is picked up on the next call. SQLite commits one writer at a time, so ledger
ids become visible in order and none is skipped.

For the `warm` strategy it also keeps, per key, each node's (count, decayed_weight,
decayed_at), re-read from the same ledger rows, and per label the rows of every node
(`WarmLabel`) with a log of the nodes whose rows changed. Active pods, policies and
node replacements have no ledger: they are re-read whenever SQLite reports any
commit (finishing a pod is an UPDATE, so it is seen that way). A KeyNode write made
without a ledger row (`increment_key_nodes` on its own) is announced through
`UNLEDGERED` to the caches of this process.

Only SQLite uses it, and only outside transactions (an uncommitted write could be
rolled back after being cached). PostgreSQL answers with one query per call: its
sequence values are not committed in order, so "ids above the last one seen" could
miss a row.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import connection

from history.models import (
    CountAdjustment,
    KeyNode,
    KeyPolicy,
    NodePolicy,
    NodeRecord,
    Placement,
)

logger = logging.getLogger(__name__)

# Bounds on memory: beyond these, the cache starts again from empty.
MAX_KEYS = 512
MAX_LABELS = 256
# A sync that names more pairs than this reloads instead (bulk edits, long pauses).
MAX_SYNC_PAIRS = 5000
# A label's change log is dropped (and its readers start over) beyond this.
MAX_CHANGES = 20000

# (keys, node) pairs written without a ledger row (`increment_key_nodes` called on
# its own), appended once committed; every cache in the process re-reads them.
UNLEDGERED: list[tuple[tuple[str, ...], str]] = []


class WarmLabel:
    """What the `warm` strategy reads for one label, kept up to date.

    `history` maps each node with rows for the label's keys to its (key, count,
    decayed_weight, decayed_at) rows, leaving out rows from before the node was
    replaced (as `history.services.key_node_history`). `changes` lists the nodes
    whose rows changed, in order, so readers holding something derived from
    `history` can bring it up to date; a new WarmLabel replaces this one when the
    log grows too long or node replacements change.
    """

    __slots__ = ("keys", "history", "changes")

    def __init__(self, keys: tuple[str, ...]):
        self.keys = keys
        self.history: dict[str, list[tuple[str, int, float, float]]] = {}
        self.changes: list[str] = []


class MatchCache:
    """Counts per key and best matches per label for one database connection."""

    def __init__(self, clamp: int):
        self.clamp = clamp
        self.reset(None)

    def reset(self, raw) -> None:
        self.raw = raw
        self.token = None
        self.placement_id = None
        self.adjustment_id = None
        # key -> {node: count} for count > 0
        self.counts: dict[str, dict[str, int]] = {}
        # tuple of keys (general to specific) -> {node: (index, clamped count)}
        self.best: dict[tuple[str, ...], dict[str, tuple[int, int]]] = {}
        # (label, derive) -> (label's best dict at the time, derive's result); a
        # label's best dict is replaced, never changed in place, when it changes.
        self.derived: dict[tuple, tuple[dict, object]] = {}
        self.unledgered = len(UNLEDGERED)
        # For `warm`: key -> {node: (count, decayed_weight, decayed_at)}, count > 0.
        self.rows: dict[str, dict[str, tuple[int, float, float]]] = {}
        self.labels: dict[tuple[str, ...], WarmLabel] = {}
        # Tables without a ledger, re-read whenever the database changed at all.
        self.extra_token = None
        self.active: dict[str, dict[str, int]] = {}
        self.busy: dict[str, int] = {}
        self.policies: tuple[dict, dict] = ({}, {})
        self.replaced: dict[str, float] = {}
        # Free for readers: things derived from the above, dropped on reset.
        self.memo: dict = {}

    # --- public -------------------------------------------------------------------

    def best_matches(
        self, keys: Sequence[str], nodes: Sequence[str]
    ) -> dict[str, tuple[int, int]]:
        """Same contract as `history.services.best_matches`."""
        self._refresh()
        label = tuple(keys)
        best = self.best.get(label)
        if best is None:
            best = self._build(label)
        get = best.get
        return {node: match for node in nodes if (match := get(node)) is not None}

    def derive(self, keys: Sequence[str], derive):
        """`derive(keys, best)` over the best matches of every node with history
        for `keys`, computed once and reused until that history changes."""
        self._refresh()
        label = tuple(keys)
        best = self.best.get(label)
        if best is None:
            best = self._build(label)
        memo = self.derived.get((label, derive))
        if memo is not None and memo[0] is best:
            return memo[1]
        result = derive(label, best)
        self.derived[label, derive] = (best, result)
        return result

    def warm(self, keys: Sequence[str]) -> WarmLabel:
        """The label's WarmLabel, with `active`, `busy`, `policies` and `replaced`
        current as of this call."""
        self._refresh()
        if self.extra_token != self.token:
            self._read_extra()
        label = tuple(keys)
        warm = self.labels.get(label)
        if warm is None:
            if len(self.labels) >= MAX_LABELS or len(self.rows) + len(label) > MAX_KEYS:
                self.rows.clear()
                self.labels.clear()
                self.memo.clear()
            warm = self.labels[label] = WarmLabel(label)
            for key in dict.fromkeys(label):
                self._load_rows(key)
            for node in {node for key in label for node in self.rows[key]}:
                self._warm_node(warm, node)
        return warm

    def _load_rows(self, key: str) -> None:
        if key not in self.rows:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT node, count, decayed_weight, decayed_at "
                    f"FROM {KeyNode._meta.db_table} WHERE key = %s AND count > 0",
                    [key],
                )
                self.rows[key] = {
                    node: (count, weight, at)
                    for node, count, weight, at in cursor.fetchall()
                }

    def _warm_node(self, warm: WarmLabel, node: str) -> None:
        since = self.replaced.get(node)
        rows = []
        for key in dict.fromkeys(warm.keys):
            row = self.rows[key].get(node)
            if row is not None and (since is None or row[2] >= since):
                rows.append((key, *row))
        if rows:
            warm.history[node] = rows
        else:
            warm.history.pop(node, None)

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
        convert = connection.ops.convert_datetimefield_value
        for kind, first, second, third, fourth in rows:
            if kind == 0:
                active.setdefault(second, {})[first] = third
                busy[first] = busy.get(first, 0) + third
            elif kind == 1:
                key_policies[first] = (bool(third), float(fourth))
            elif kind == 2:
                node_policies.setdefault(first, {})[second] = third
            else:
                replaced[first] = convert(second, None, connection).timestamp()
        self.active, self.busy = active, busy
        # Replaced only when they change, so readers can tell by identity.
        if (key_policies, node_policies) != self.policies:
            self.policies = (key_policies, node_policies)
        if replaced != self.replaced:
            self.replaced = replaced
            self.labels.clear()
            self.memo.clear()
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
        if token == self.token and self.unledgered == len(UNLEDGERED):
            return
        with connection.cursor() as cursor:
            if self.placement_id is None:
                self._mark(cursor)
            else:
                self._sync(cursor)
        self.token = token

    def _mark(self, cursor) -> None:
        """Remember where the ledger ends; counts read after this are current."""
        cursor.execute(f"SELECT MAX(id) FROM {Placement._meta.db_table}")
        self.placement_id = cursor.fetchone()[0] or 0
        cursor.execute(f"SELECT MAX(id) FROM {CountAdjustment._meta.db_table}")
        self.adjustment_id = cursor.fetchone()[0] or 0

    def _sync(self, cursor) -> None:
        """Re-read the counts of the pairs named by ledger rows added since."""
        from history.services import split_pipeline_label

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
            self.placement_id = max(self.placement_id, row_id)
            for key in split_pipeline_label(label):
                if key in self.counts or key in self.rows:
                    pairs.setdefault(key, set()).add(node)
        for row_id, key, node in adjustments:
            self.adjustment_id = max(self.adjustment_id, row_id)
            if key in self.counts or key in self.rows:
                pairs.setdefault(key, set()).add(node)
        end = len(UNLEDGERED)
        for keys, node in UNLEDGERED[self.unledgered : end]:
            for key in keys:
                if key in self.counts or key in self.rows:
                    pairs.setdefault(key, set()).add(node)
        self.unledgered = end
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
        rows = {node: (count, weight, at) for node, count, weight, at in cursor}
        if key in self.rows:
            self._reread_warm(key, nodes, rows)
        if key not in self.counts:
            return
        found = {node: row[0] for node, row in rows.items()}
        counts = self.counts[key]
        for node in nodes:
            count = found.get(node, 0)
            if count > 0:
                counts[node] = count
            else:
                counts.pop(node, None)
        for label, best in list(self.best.items()):
            if key in label:
                best = self.best[label] = dict(best)
                for node in nodes:
                    self._place(label, best, node)

    def _reread_warm(self, key, nodes, rows) -> None:
        cached = self.rows[key]
        for node in nodes:
            row = rows.get(node)
            if row is not None and row[0] > 0:
                cached[node] = row
            else:
                cached.pop(node, None)
        for label, warm in list(self.labels.items()):
            if key in label:
                if len(warm.changes) + len(nodes) > MAX_CHANGES:
                    # Readers holding the old one start over.
                    fresh = self.labels[label] = WarmLabel(label)
                    fresh.history = warm.history
                    warm = fresh
                for node in nodes:
                    self._warm_node(warm, node)
                warm.changes.extend(nodes)

    # --- building -----------------------------------------------------------------

    def _load(self, key: str) -> dict[str, int]:
        counts = self.counts.get(key)
        if counts is None:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT node, count FROM {KeyNode._meta.db_table} "
                    f"WHERE key = %s AND count > 0",
                    [key],
                )
                counts = self.counts[key] = dict(cursor.fetchall())
        return counts

    def _build(self, label: tuple[str, ...]) -> dict[str, tuple[int, int]]:
        if len(self.best) >= MAX_LABELS or len(self.counts) + len(label) > MAX_KEYS:
            self.counts.clear()
            self.best.clear()
            self.derived.clear()
        clamp = self.clamp
        best: dict[str, tuple[int, int]] = {}
        # General to specific: a later (more specific) segment overwrites, and a
        # segment repeated in the label counts at its last position.
        for index, key in enumerate(label):
            for node, count in self._load(key).items():
                best[node] = (index, count if count < clamp else clamp)
        self.best[label] = best
        return best

    def _place(self, label, best, node) -> None:
        for index in range(len(label) - 1, -1, -1):
            count = self.counts[label[index]].get(node)
            if count:
                best[node] = (index, count if count < self.clamp else self.clamp)
                return
        best.pop(node, None)
