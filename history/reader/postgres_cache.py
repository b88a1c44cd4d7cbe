"""The process cache's change feed on PostgreSQL: a change log read against
snapshots.

Triggers (migration 0005) log every change to the tables scoring reads, in the
writing transaction, with that transaction's id: a KeyNode row change logs its
(key, node), a statement on the ledger, the policies or the node records logs one
"other" row, a TRUNCATE logs "start over". Whatever writes (the admin, the
watcher, a management command, raw SQL), the log is written.

The process cache remembers the snapshot of its last look (its watermark, the
database's and not a connection's: every connection of the process follows from
it). Per call it runs one statement (`pg_look`, prepared per connection) that
returns the current snapshot (`pg_current_snapshot()`) together with the log rows
the previous snapshot did not see (`NOT pg_visible_in_snapshot`, from that
snapshot's xmin on, which the index on `xid` serves). A view sends it ahead on its
connection (`look_ahead`, see `history.reader.reading_ahead`) so that the round
trip overlaps parsing the request; its answer is used only if no other look moved
the watermark meanwhile (otherwise `sync` looks again).

Why nothing is missed, whatever the commit order of concurrent writers: the
snapshot and the rows come from one statement, so they describe the same state.
A log row is visible to a statement exactly when its transaction committed before
that statement's snapshot. So every committed log row is "new" in exactly one look
of each worker: the first whose snapshot sees it; a transaction that took an early
id but commits late is in the previous snapshot's in-progress list and is found
when it commits. Rows loaded afterwards are read by later statements, which see at
least as much; re-reading a pair twice is harmless.

Running pipeline pods are logged pod by pod (migration 0010: a pod starts or stops
running) and applied as deltas. A delta must count once, but the running pods are
read whole after a start-over, under a snapshot newer than the look's, and a later
look may report changes that read already saw: the read keeps its snapshot
(`running_snapshot`), and a logged change visible in it is skipped, until the
looks' snapshots have moved past it.

Start over (forget everything, keep only the new snapshot) when:
- the log was pruned past what this worker still needs (its previous snapshot's
  xmin is below the horizon) — a worker idle for longer than the retention;
- the database is not the one it was (another cluster's `system_identifier` or
  another database's oid: a restore, a copy, a failover to another cluster), or
  its transaction ids went backwards (a point-in-time restore);
- a TRUNCATE was logged, or more changes arrived than `MAX_SYNC_PAIRS`.

The check runs on the driver's connection, without Django's per-request health
check round trip; a broken connection is reopened once and the call retried. Each
connection is met once (which database it reaches; the look prepared on it).
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

import psycopg
from django.db import connection
from django.db.utils import Error as DjangoDatabaseError
from psycopg import pq

from history.reader import pg_look
from history.reader.cache import MAX_SYNC_PAIRS, CachedReader
from history.reader.model import Change
from history.reader.pg_look import CHANGE_TABLE, HORIZON_TABLE

logger = logging.getLogger(__name__)

# Log rows older than this may be pruned; a worker that has not looked for longer
# starts over. Pruning runs at most once per PRUNE_EVERY seconds per worker, after a
# request's reply is sent, and deletes at most PRUNE_BATCH rows at a time: a large
# backlog (a bulk load logs a row per KeyNode row) goes over several rounds.
RETENTION_SECONDS = 300
PRUNE_EVERY = 60.0
PRUNE_BATCH = 10000

# Which database a connection talks to: the cluster and the database in it.
_IDENTITY = (
    "SELECT CONCAT(sys.system_identifier, '/', d.oid) "
    "FROM pg_control_system() AS sys, pg_database AS d "
    "WHERE d.datname = current_database()"
)

# Every RETENTION_SECONDS the horizon moves up to the oldest snapshot xmin of the
# previous round; it commits before any row below it is deleted, so a look whose
# snapshot misses a log row it needs also sees the new horizon and starts over.
_ADVANCE = (
    f"UPDATE {HORIZON_TABLE} SET horizon = pending, "
    f"pending = pg_snapshot_xmin(pg_current_snapshot()), "
    f"pending_at = clock_timestamp() "
    f"WHERE id = (SELECT id FROM {HORIZON_TABLE} WHERE id = 1 "
    f"AND pending_at < clock_timestamp() - make_interval(secs => %s) "
    f"FOR UPDATE SKIP LOCKED)"
)
# The batch's ids are taken once, as an array: `id IN (SELECT ... LIMIT n)` can be
# planned as the inner side of a nested loop, run again per outer row, and then
# delete more than n rows.
_DELETE_BELOW_HORIZON = (
    f"DELETE FROM {CHANGE_TABLE} WHERE id = ANY(ARRAY(SELECT id FROM {CHANGE_TABLE} "
    f"WHERE xid < (SELECT horizon FROM {HORIZON_TABLE} WHERE id = 1) "
    f"LIMIT %s FOR UPDATE SKIP LOCKED))"
)


def _xmin(snapshot: str) -> int:
    return int(snapshot.split(":", 1)[0])


def _xmax(snapshot: str) -> int:
    return int(snapshot.split(":", 2)[1])


def _visible(xid: int, snapshot: str) -> bool:
    """Whether a transaction's changes are visible in `snapshot` (committed before
    it was taken; the log holds only committed rows), as pg_visible_in_snapshot."""
    xmin, xmax, running = snapshot.split(":", 2)
    if xid < int(xmin):
        return True
    if xid >= int(xmax):
        return False
    return str(xid) not in running.split(",")


class PostgresCacheReader(CachedReader):
    """The process cache on PostgreSQL, following the change log."""

    def __init__(self) -> None:
        super().__init__()
        # How often this cache started over (for tests and the logs).
        self.starts = 0
        # The driver connections met, and the database each reaches.
        self.identities: weakref.WeakKeyDictionary[psycopg.Connection, str | None] = (
            weakref.WeakKeyDictionary()
        )
        self.pruned_at = time.monotonic()
        # Connections with a look sent ahead of `sync`, and the snapshot it was
        # sent for (see `look_ahead`).
        self.sent: weakref.WeakKeyDictionary[psycopg.Connection, str | None] = (
            weakref.WeakKeyDictionary()
        )
        # Whether the look is sent as the connection's prepared statement.
        self.prepared = True

    def clear(self) -> None:
        super().clear()
        self.snapshot: str | None = None
        self.system: str | None = None
        # The snapshot the running pods were last read under, while later looks
        # may still report changes it saw.
        self.running_snapshot: str | None = None

    @property
    def ahead(self) -> psycopg.Connection | None:
        """This thread's connection if a look was sent ahead on it."""
        raw = connection.connection
        return raw if raw is not None and raw in self.sent else None

    def sync(self) -> None:
        try:
            rows, system = self._look()
        except DjangoDatabaseError:
            # A connection that broke while idle: reopen it once.
            connection.close()
            rows, system = self._look()
        snapshot, horizon, *_ = rows[0]
        previous = self.snapshot
        if previous is not None and (
            system != self.system
            or _xmax(snapshot) < _xmax(previous)
            or _xmin(previous) < int(horizon)
            or len(rows) > MAX_SYNC_PAIRS
            or any(row[2] == Change.START_OVER for row in rows)
        ):
            logger.info("History cache starts over (database changed or log pruned)")
            previous = None
        if previous is None:
            self.clear()
            self.starts += 1
        else:
            pairs: dict[str, set[str]] = {}
            pods = []
            running = self.running_snapshot
            for _, _, kind, key, node, xid in rows:
                if kind == Change.KEY_NODE:
                    if self.is_cached(key):
                        pairs.setdefault(key, set()).add(node)
                elif kind == Change.OTHER:
                    self.extra_changed()
                elif kind in (Change.POD_STARTED, Change.POD_STOPPED):
                    # A delta counts once: the running pods read since the
                    # previous look (under `running`) may hold it already.
                    if running is None or not _visible(xid, running):
                        delta = 1 if kind == Change.POD_STARTED else -1
                        pods.append((key, node, delta))
            self.changed(pairs)
            self.pods_changed(pods)
        self.snapshot, self.system = snapshot, system
        if self.running_snapshot is not None and _xmin(snapshot) >= _xmax(
            self.running_snapshot
        ):
            # Whatever that read saw, later looks see as old: no more overlap.
            self.running_snapshot = None

    def running_read(self, snapshot: str | None) -> None:
        self.running_snapshot = snapshot

    def look_ahead(self) -> None:
        """Send this request's look now, on this thread's connection; `sync` takes
        its answer.

        The round trip then overlaps the caller's own work (reading and parsing the
        request body) instead of adding to it. Only on a connection already met,
        open and idle, outside transactions: otherwise `sync` looks as usual. The
        look's snapshot is taken when the request is already being served, so it
        sees every write committed before the request was sent, as a look inside
        `sync` does.
        """
        raw = connection.connection
        if (
            raw is None
            or raw in self.sent
            or raw not in self.identities
            or connection.in_atomic_block
            or raw.pgconn.transaction_status != pq.TransactionStatus.IDLE
        ):
            return
        previous = self.snapshot
        try:
            pg_look.send(raw.pgconn, previous, prepared=self.prepared)
        except psycopg.Error:
            # A broken connection: `sync` reopens it.
            return
        self.sent[raw] = previous

    def settle(self) -> None:
        """Take the answer of a look sent ahead that no `sync` took (the request
        ended before reading any history), so the connection is idle again."""
        raw = connection.connection
        if raw is None or raw not in self.sent:
            return
        del self.sent[raw]
        if not raw.closed:
            try:
                pg_look.take(raw.pgconn)
            except psycopg.Error as exc:
                logger.warning("A history look sent ahead failed: %s", exc)

    def _look(self) -> tuple[list[tuple[Any, ...]], str | None]:
        """The current snapshot and the log rows the cache's snapshot did not see,
        and the database the connection reaches (under `lock`)."""
        connection.ensure_connection()
        raw = connection.connection
        with connection.wrap_database_errors:
            if raw not in self.identities:
                self._meet(raw)
            if raw in self.sent:
                previous = self.sent.pop(raw)
                rows = self._take(raw, previous)
                if previous == self.snapshot:
                    return rows, self.identities[raw]
                # Another look moved the watermark since it was sent: look again.
            pg_look.send(raw.pgconn, self.snapshot, prepared=self.prepared)
            return self._take(raw, self.snapshot), self.identities[raw]

    def _take(self, raw: psycopg.Connection, previous: str | None) -> list[Any]:
        try:
            return pg_look.take(raw.pgconn)
        except psycopg.errors.InvalidSqlStatementName:
            logger.info(
                "The prepared history look is gone (a transaction-pooling "
                "proxy?): sending it unprepared from now on"
            )
            self.prepared = False
            pg_look.send(raw.pgconn, previous, prepared=False)
            return pg_look.take(raw.pgconn)

    def _meet(self, raw: psycopg.Connection) -> None:
        """A new connection: ask which database it reaches, prepare the look."""
        with psycopg.ClientCursor(raw) as cursor:
            cursor.execute(_IDENTITY)
            row = cursor.fetchone()
        pg_look.prepare(raw)
        self.identities[raw] = row[0] if row else None
        self.prepared = True

    def after_request(self) -> None:
        """Prune the log if this worker's turn came (the reply is already sent)."""
        with self.lock:
            if time.monotonic() - self.pruned_at <= PRUNE_EVERY:
                return
            self.pruned_at = time.monotonic()
        self.prune()

    def prune(self) -> int:
        """Move the horizon if its time came, then delete up to PRUNE_BATCH log rows
        below it; returns how many were deleted."""
        try:
            with connection.cursor() as cursor:
                cursor.execute(_ADVANCE, [RETENTION_SECONDS])
                cursor.execute(_DELETE_BELOW_HORIZON, [PRUNE_BATCH])
                return int(cursor.rowcount)
        except DjangoDatabaseError as exc:
            logger.warning("Could not prune the history change log: %s", exc)
            return 0
