"""The PostgreSQL cache's look on the wire: sent on the driver's connection, taken
when the answer is needed.

The look is one call of `kssched_history_look(previous)` (migration 0010). It is
sent with libpq's asynchronous calls, so a caller can send it, do its own work
while the server answers, and take the answer afterwards (`history.reader.
reading_ahead`). Between `send` and `take` nothing else may use the connection.

Each connection prepares the call once (`PREPARE kssched_look`), so the server
neither parses nor plans it per call. Behind a transaction-pooling proxy the
statements of one client session can reach server sessions where it was never
prepared: the answer "prepared statement does not exist" is raised as
`psycopg.errors.InvalidSqlStatementName`, and the caller sends the call unprepared
from then on.
"""

from __future__ import annotations

import select

import psycopg
from psycopg import pq

NAME = b"kssched_look"
CALL = "SELECT * FROM kssched_history_look($1)"
PREPARE = f"PREPARE kssched_look(text) AS {CALL}"


def prepare(raw: psycopg.Connection) -> None:
    """Prepare the call on this connection (already prepared is fine)."""
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
        pgconn.send_query_params(CALL.encode(), parameters)
    while pgconn.flush():
        _wait(pgconn.socket, select.POLLOUT)


def take(pgconn: pq.abc.PGconn) -> list[tuple]:
    """Wait for the answer of the look sent on `pgconn`: rows of (snapshot,
    horizon, kind, key, node), the first three the same on every row."""
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
    snapshot, horizon, kind, key, node = (result.get_value(row, i) for i in range(5))
    return (
        _text(snapshot),
        _text(horizon),
        int(kind) if kind is not None else None,
        _text(key),
        _text(node),
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
