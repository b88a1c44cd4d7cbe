"""The process cache's change feed on SQLite: the ledger.

A prioritize call for 5000 nodes and a four-segment label reads about 12 000 KeyNode
rows; on SQLite that query alone takes about 10 ms, five times what parsing and
answering the request costs. So each web worker keeps the rows of the keys it has
been asked about in memory (`cache.CachedReader`, one per process) and brings them
up to date before each answer.

It knows what changed from the ledger: every write to a KeyNode count goes with a
new Placement or CountAdjustment row in the same transaction (the invariant
`audit_counts` checks). The watermark is the last ledger ids the cache has seen,
the database's and not a connection's, so every connection of the process follows
from it. Before each read the connection asks SQLite whether anything was committed
since its own last look (`PRAGMA data_version` for other connections,
`total_changes` for its own; both are per connection, so each connection keeps its
token); if nothing was, the cache is at least as recent as that look. Otherwise it
reads the ledger rows added since the watermark and re-reads the rows of the (key,
node) pairs they name, applies the pods that started or stopped running since
(`history_podlog`, written by triggers: migration 0010) and re-reads the policies
and node records (small tables) when their version moved (`history_smalltables`,
bumped by triggers: migration 0018). SQLite commits one writer at a time, so ids
become visible in order and none is skipped; ledger ids that went backwards (the
file was replaced) start the cache over. The pod log is pruned after requests
(POD_LOG_KEEP rows are kept), and a cache that fell behind the pruned part reads
the running pods again, with the last pod log id they include in the same
statement.
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError, connection
from django.db.backends.utils import CursorWrapper

from history.labels import placement_keys
from history.models import CountAdjustment, Placement
from history.reader.cache import MAX_SYNC_PAIRS, CachedReader
from history.reader.sql import POD_LOG

# Bumped by triggers on every change of the policies and the node records.
SMALL_TABLES_VERSION = "history_smalltables"

logger = logging.getLogger(__name__)

# Pod log rows kept when pruning (at most once a minute per worker).
POD_LOG_KEEP = 100_000
PRUNE_EVERY = 60.0


# Where a connection keeps its token of its last look (see the module's doc): the
# cache, the sqlite3 connection, its data_version and total_changes.
TOKEN = "kssched_history_token"


class SqliteCacheReader(CachedReader):
    """The process cache on SQLite, following the ledger."""

    def clear(self) -> None:
        super().clear()
        self.placement_id: int | None = None
        self.adjustment_id = 0
        self.pod_id = 0
        self.small_version = 0
        self.pruned_at = time.monotonic()

    def sync(self) -> None:
        connection.ensure_connection()
        raw = connection.connection
        # Asked on every call: straight on the sqlite3 connection, which costs a
        # tenth of a Django cursor (errors are still Django's).
        with connection.wrap_database_errors:
            version = raw.execute("PRAGMA data_version").fetchone()[0]
        token = (self, raw, version, raw.total_changes)
        seen = getattr(connection, TOKEN, None)
        if (
            self.placement_id is not None
            and seen is not None
            and seen[0] is self
            and seen[1] is raw
            and seen[2:] == token[2:]
        ):
            return
        with connection.cursor() as cursor:
            if self.placement_id is None or not self._follow_ledger(cursor):
                self.clear()
                self._mark(cursor)
        setattr(connection, TOKEN, token)

    def _mark(self, cursor: CursorWrapper) -> None:
        """Remember where the ledger ends; rows read after this are current."""
        (
            self.placement_id,
            self.adjustment_id,
            self.pod_id,
            self.small_version,
        ) = self._ends(cursor)
        self.running_changed()

    def _ends(self, cursor: CursorWrapper) -> tuple[int, int, int, int]:
        """The last ids of the placements, the adjustments and the pod log, and the
        version of the small tables (policies, node records: migration 0018)."""
        cursor.execute(
            f"SELECT (SELECT MAX(id) FROM {Placement._meta.db_table}), "
            f"(SELECT MAX(id) FROM {CountAdjustment._meta.db_table}), "
            f"(SELECT MAX(id) FROM {POD_LOG}), "
            f"(SELECT MAX(version) FROM {SMALL_TABLES_VERSION})"
        )
        placement, adjustment, pod, small = cursor.fetchone()
        return placement or 0, adjustment or 0, pod or 0, small or 0

    def _follow_ledger(self, cursor: CursorWrapper) -> bool:
        """Re-read the rows of the pairs named by ledger rows added since; False
        when the ledger cannot say (too many rows, or ids went backwards)."""
        placement, adjustment, _, small = self._ends(cursor)
        if placement < (self.placement_id or 0) or adjustment < self.adjustment_id:
            return False
        if small != self.small_version:
            self.small_version = small
            self.extra_changed()
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
            return False
        pairs: dict[str, set[str]] = {}
        for row_id, label, node in placements:
            self.placement_id = max(self.placement_id or 0, row_id)
            for key in placement_keys(label):
                if self.is_cached(key):
                    pairs.setdefault(key, set()).add(node)
        for row_id, key, node in adjustments:
            self.adjustment_id = max(self.adjustment_id, row_id)
            if self.is_cached(key):
                pairs.setdefault(key, set()).add(node)
        self.changed(pairs)
        self._follow_pods(cursor)
        return True

    def _follow_pods(self, cursor: CursorWrapper) -> None:
        """Apply the pods that started or stopped running since the last look."""
        cursor.execute(
            f"SELECT id, label, node, delta FROM {POD_LOG} "
            f"WHERE id > %s ORDER BY id LIMIT %s",
            [self.pod_id, MAX_SYNC_PAIRS + 1],
        )
        rows = cursor.fetchall()
        if not rows:
            return
        if len(rows) > MAX_SYNC_PAIRS or rows[0][0] != self.pod_id + 1:
            # Too many, or pruned past this cache: read them all again.
            self.running_changed()
            return
        self.pods_changed((label, node, delta) for _, label, node, delta in rows)
        self.pod_id = rows[-1][0]

    def running_read(self, snapshot: str | None) -> None:
        """The pods that started or stopped up to pod log id `snapshot`, read with
        the running pods in the same statement, are in them: follow from there (a
        mark taken in another statement could count a pod twice)."""
        self.pod_id = int(snapshot or 0)

    def after_request(self) -> None:
        """Prune the pod log now and then (the reply is already sent)."""
        now = time.monotonic()
        with self.lock:
            if now - self.pruned_at < PRUNE_EVERY:
                return
            self.pruned_at = now
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"DELETE FROM {POD_LOG} WHERE id <= "
                    f"(SELECT MAX(id) FROM {POD_LOG}) - %s",
                    [POD_LOG_KEEP],
                )
        except DatabaseError as exc:
            logger.warning("Could not prune the pod log: %s", exc)
