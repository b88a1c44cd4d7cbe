"""The PostgreSQL cache's look on the wire: sent on the driver's connection, taken
when the answer is needed.

The look is one statement: the current snapshot, the log's horizon, and the log
rows the `previous` snapshot did not see, all under one snapshot (see
`history.reader.postgres_cache` for why that is exact). It is sent with libpq's
asynchronous calls, so a caller can send it, do its own work while the server
answers, and take the answer afterwards (`history.reader.reading_ahead`). Between
`send` and `take` nothing else may use the connection.

Each connection prepares it once (`PREPARE kssched_look`), so the server neither
parses nor plans it per call. Behind a transaction-pooling proxy the statements of
one client session can reach server sessions where it was never prepared: the
answer "prepared statement does not exist" is raised as
`psycopg.errors.InvalidSqlStatementName`, and the caller sends the statement's text
from then on (parsed and planned per call: about 0.1 ms more).
"""

from __future__ import annotations

import select

import psycopg
from psycopg import pq

from history.reader.cache import MAX_SYNC_PAIRS

# The change log and its horizon (migration 0005).
CHANGE_TABLE = "history_change"
HORIZON_TABLE = "history_change_horizon"
NAME = b"kssched_look"
# Each use of the parameter goes through a scalar subquery and the limit is a
# literal, so the planner has nothing to fold into a custom plan and keeps the
# generic one after five runs (an unknown LIMIT would make it expect millions of
# rows and compile the statement with JIT). ORDER BY xid keeps the index scan even
# when the log's statistics are missing or stale: a sequential scan of a log of
# 100 000 rows costs milliseconds. More rows than MAX_SYNC_PAIRS mean "start over",
# so one more is enough.
QUERY = (
    "SELECT CAST(s AS text), "
    f"CAST((SELECT h.horizon FROM {HORIZON_TABLE} AS h WHERE h.id = 1) AS text), "
    "c.kind, c.key, c.node, CAST(c.xid AS text) "
    "FROM pg_current_snapshot() AS s "
    f"LEFT JOIN LATERAL (SELECT l.kind, l.key, l.node, l.xid FROM {CHANGE_TABLE} AS l "
    "WHERE l.xid >= (SELECT pg_snapshot_xmin(CAST($1 AS pg_snapshot))) "
    "AND NOT pg_visible_in_snapshot(l.xid, (SELECT CAST($1 AS pg_snapshot))) "
    f"ORDER BY l.xid LIMIT {MAX_SYNC_PAIRS + 1}) AS c ON TRUE"
)
PREPARE = f"PREPARE kssched_look(text) AS {QUERY}"


def prepare(raw: psycopg.Connection) -> None:
    """Prepare the look on this connection (already prepared is fine)."""
    try:
        with psycopg.ClientCursor(raw) as cursor:
            cursor.execute(PREPARE)
    except psycopg.errors.DuplicatePreparedStatement:
        pass


def send(pgconn: pq.abc.PGconn, previous: str | None, *, prepared: bool) -> None:
    """Send the look for the snapshot `previous` (None: the first look)."""
    parameters = [previous.encode() if previous is not None else None]
    if prepared:
        pgconn.send_query_prepared(NAME, parameters)
    else:
        pgconn.send_query_params(QUERY.encode(), parameters)
    while pgconn.flush():
        _wait(pgconn.socket, select.POLLOUT)


def take(pgconn: pq.abc.PGconn) -> list[tuple]:
    """Wait for the answer of the look sent on `pgconn`: rows of (snapshot,
    horizon, kind, key, node, xid), the first two the same on every row."""
    while True:
        pgconn.consume_input()
        if not pgconn.is_busy():
            break
        _wait(pgconn.socket, select.POLLIN)
    rows: list[tuple] = []
    failed: pq.abc.PGresult | None = None
    # Every result is read, so the connection is idle again whatever happened.
    while (result := pgconn.get_result()) is not None:
        if result.status == pq.ExecStatus.TUPLES_OK:
            rows = [_row(result, row) for row in range(result.ntuples)]
        else:
            failed = result
    if failed is not None:
        raise _error(failed)
    return rows


def _row(result: pq.abc.PGresult, row: int) -> tuple:
    snapshot, horizon, kind, key, node, xid = (
        result.get_value(row, i) for i in range(6)
    )
    return (
        _text(snapshot),
        _text(horizon),
        int(kind) if kind is not None else None,
        _text(key),
        _text(node),
        int(xid) if xid is not None else None,
    )


def _text(value: bytes | None) -> str | None:
    return value.decode() if value is not None else None


def _error(result: pq.abc.PGresult) -> psycopg.Error:
    """The psycopg exception for a failed result, by its SQLSTATE."""
    state = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
    message = result.error_message.decode(errors="replace").strip()
    try:
        error = psycopg.errors.lookup(state)
    except KeyError:
        error = psycopg.DatabaseError
    return error(message)


def _wait(fd: int, events: int) -> None:
    poller = select.poll()
    poller.register(fd, events)
    poller.poll()
