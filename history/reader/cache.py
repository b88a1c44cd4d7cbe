"""What the per-worker history caches share: the rows of the keys asked about, held
once per key whatever the labels that use them, bounded in bytes.

A store's cache (`sqlite_cache`, `postgres_cache`) only says what changed since its
last look (`sync`): the (key, node) pairs to re-read, whether the small tables must
be re-read, or that everything must start over. Re-reading is idempotent, so a
change seen twice does no harm; a change never seen would, and each store explains
why none is missed.

Keys are kept in least-recently-used order. Their rows, and what the strategies
derive from them (`memo.KeyMemo`), are counted in estimated bytes; past
KSSCHED_HISTORY_CACHE_MB the least recently used keys are dropped until the cache
is under the bound again. A label never seen before costs the rows of its keys not
yet held: general keys such as `jenkins`, shared by thousands of labels, are read
once.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from django.conf import settings
from django.db import connection

from history.labels import distinct_keys
from history.models import KeyNode
from history.reader.memo import KeyMemo
from history.reader.model import LabelHistory, Policies, decode
from history.reader.pool import database_pool
from history.reader.sql import SqlReader, as_timestamp, history_sql

# A sync that names more pairs than this starts over instead (bulk edits, pauses).
MAX_SYNC_PAIRS = 5000
# Estimated bytes a cached row takes: a dict slot, a 3-tuple, an int and two
# floats (node names are interned, so each name is held once).
ROW_BYTES = 200
# Estimated bytes of a key without rows (its dict, LRU slot, epoch and log).
KEY_BYTES = 400


def budget_bytes() -> int:
    """KSSCHED_HISTORY_CACHE_MB in bytes."""
    return int(settings.KSSCHED_HISTORY_CACHE_MB * 1024 * 1024)


class CachedReader:
    """The history of the keys asked about, kept up to date by `sync`.

    Inside a transaction it answers through `SqlReader` instead: an uncommitted
    write could be rolled back after being cached.
    """

    def __init__(self) -> None:
        self.sql = SqlReader()
        self.memo = KeyMemo()
        self.clear()

    def clear(self) -> None:
        """Forget everything; the next read loads what it needs."""
        # key -> {node: (count, decayed_weight, decayed_at)} for count > 0, in
        # least-recently-used order.
        self.rows: OrderedDict[str, dict[str, tuple[int, float, float]]] = OrderedDict()
        self.row_bytes = 0
        self.memo.clear()
        # Policies and node records, re-read when `sync` says they changed; the
        # running pods, kept up to date pod by pod (`pod_changed`) once read.
        self.extra_stale = True
        self.running_stale = True
        self.active: dict[str, dict[str, int]] = {}
        self.busy: dict[str, int] = {}
        self.policies = Policies()
        self.replaced: Mapping[str, float] = {}

    @property
    def bytes(self) -> int:
        """Estimated bytes held: rows, keys and derived values."""
        return self.row_bytes + self.memo.bytes

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
        unique = distinct_keys(keys)
        missing = [key for key in unique if key not in self.rows]
        if missing:
            self._load_rows(missing)
        rows = self.rows
        for key in unique:
            rows.move_to_end(key)
        self._bound(keep=unique)
        return LabelHistory(
            keys=tuple(keys),
            by_key={key: rows[key] for key in unique},
            replaced=self.replaced,
            active=self.active.get(label, {}),
            busy=self.busy,
            policies=self.policies,
            memo=self.memo,
        )

    def pool(self, *, now: float, days: float) -> tuple[str, ...]:
        """The pipeline pool (`pool.database_pool`)."""
        return database_pool.at(now=now, days=days)

    # --- what `sync` reports --------------------------------------------------------

    def is_cached(self, key: str) -> bool:
        return key in self.rows

    def changed(self, pairs: Mapping[str, set[str]]) -> None:
        """Re-read the rows of these (key, nodes) pairs; keys not cached are skipped."""
        for key, nodes in pairs.items():
            if key in self.rows and nodes:
                self._reread(key, sorted(nodes))

    def extra_changed(self) -> None:
        """The policies or the node records changed."""
        self.extra_stale = True

    def running_changed(self) -> None:
        """The running pods must be read again, all of them."""
        self.running_stale = self.extra_stale = True

    def running_read(self, snapshot: str | None) -> None:
        """Every running pod was just read (under `snapshot` on PostgreSQL)."""

    def pod_changed(self, label: str, node: str, delta: int) -> None:
        """A pod of `label` on `node` started (+1) or stopped (-1) running."""
        if self.running_stale:
            return
        for counts, key in (
            (self.active.setdefault(label, {}), node),
            (self.busy, node),
        ):
            value = counts.get(key, 0) + delta
            if value > 0:
                counts[key] = value
            else:
                counts.pop(key, None)
        if not self.active[label]:
            del self.active[label]

    # --- keys -----------------------------------------------------------------------

    def _bound(self, keep: Sequence[str]) -> None:
        """Drop least recently used keys while over the byte budget (never the keys
        of the read being answered)."""
        budget = budget_bytes()
        while self.bytes > budget and len(self.rows) > len(keep):
            key = next(iter(self.rows))
            if key in keep:
                self.rows.move_to_end(key)
                continue
            self._drop(key)

    def _drop(self, key: str) -> None:
        dropped = self.rows.pop(key)
        self.row_bytes -= KEY_BYTES + len(dropped) * ROW_BYTES
        self.memo.forget(key)

    def _load_rows(self, keys: list[str]) -> None:
        """Every row with count > 0 of `keys`, in one query."""
        intern = sys.intern
        loaded: dict[str, dict[str, tuple[int, float, float]]] = {
            key: {} for key in keys
        }
        marks = ", ".join(["%s"] * len(keys))
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT key, node, count, decayed_weight, decayed_at "
                f"FROM {KeyNode._meta.db_table} WHERE key IN ({marks}) AND count > 0",
                keys,
            )
            for key, node, count, weight, at in cursor.fetchall():
                loaded[key][intern(node)] = (count, weight, at)
        for key, rows in loaded.items():
            self.rows[key] = rows
            self.row_bytes += KEY_BYTES + len(rows) * ROW_BYTES
            self.memo.start(key)

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
        before = len(cached)
        intern = sys.intern
        for node in nodes:
            row = found.get(node)
            if row is not None and row[0] > 0:
                cached[intern(node)] = row
            else:
                cached.pop(node, None)
        self.row_bytes += (len(cached) - before) * ROW_BYTES
        self.memo.changed(key, nodes)

    def _read_extra(self) -> None:
        """Policies and node replacements (small tables), and the running pods when
        they must be read again, in one statement."""
        running = self.running_stale
        with connection.cursor() as cursor:
            cursor.execute(history_sql(running=running))
            found = decode(cursor.fetchall(), as_timestamp)
        if running:
            self.active, self.busy = found.active, found.busy
            self.running_stale = False
            self.running_read(found.snapshot)
        self.policies = found.policies
        if found.replaced != self.replaced:
            # What was derived from the rows no longer holds.
            self.replaced = found.replaced
            self.memo.restart_all()
        self.extra_stale = False
