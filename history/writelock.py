"""Writes that wait, for a bounded time, for SQLite's write lock instead of failing.

The watcher and the web workers share one SQLite file, and one writer at a time holds
its write lock. A write transaction (`BEGIN IMMEDIATE`) waits up to
KSSCHED_SQLITE_TIMEOUT for the lock, then fails with "database is locked"; for an
admin edit that was a bare 500 and a lost edit. `run_write` runs the write in one
transaction and, while another connection holds the lock, tries again until a
deadline, so the caller can tell the user that nothing was changed.
"""

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from django.db import OperationalError, connections, transaction

from history.exceptions import WriteLockTimeoutError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Pause between attempts: the lock holder usually commits within milliseconds.
RETRY_PAUSE = 0.05


def is_write_lock_timeout(exc: OperationalError, *, using: str = "default") -> bool:
    """True when `exc` is SQLite giving up on a lock another connection holds."""
    if connections[using].vendor != "sqlite":
        return False
    message = str(exc)
    return "database is locked" in message or "database table is locked" in message


def run_write(write: Callable[[], T], *, wait: float, using: str = "default") -> T:
    """Return `write()`, run in one transaction that waits at most `wait` seconds in
    all for SQLite's write lock.

    Each attempt waits inside SQLite (its busy timeout, shortened to the time left);
    an attempt that still finds the lock taken is rolled back and tried again after a
    short pause. Raises WriteLockTimeoutError once `wait` has passed: every attempt
    was rolled back, so nothing was changed. Other errors propagate at once. On
    PostgreSQL, or inside a transaction already (which holds the lock), `write()`
    simply runs in a transaction.
    """
    connection = connections[using]
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        with transaction.atomic(using=using):
            return write()
    started = time.monotonic()
    deadline = started + wait
    configured = configured_busy_timeout(using=using)
    attempts = 0
    while True:
        attempts += 1
        remaining = max(deadline - time.monotonic(), 0.001)
        try:
            with busy_timeout(min(configured, remaining), using=using):
                with transaction.atomic(using=using):
                    return write()
        except OperationalError as exc:
            if not is_write_lock_timeout(exc, using=using):
                raise
            waited = time.monotonic() - started
            if time.monotonic() + RETRY_PAUSE >= deadline:
                raise WriteLockTimeoutError(attempts=attempts, waited=waited) from exc
            logger.warning(
                "The SQLite write lock is held elsewhere after %.1f s; trying the "
                "write again (attempt %d)",
                waited,
                attempts + 1,
            )
            time.sleep(RETRY_PAUSE)


def configured_busy_timeout(*, using: str = "default") -> float:
    """Seconds SQLite waits for a lock on this connection (KSSCHED_SQLITE_TIMEOUT;
    Python's sqlite3 waits 5 s when none is set)."""
    options = connections[using].settings_dict.get("OPTIONS", {})
    return float(options.get("timeout", 5.0))


@contextmanager
def busy_timeout(seconds: float, *, using: str = "default") -> Iterator[None]:
    """Make SQLite wait at most `seconds` for a lock inside the block, then restore
    the connection's configured busy timeout."""
    connection = connections[using]
    configured = configured_busy_timeout(using=using)
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {max(int(seconds * 1000), 1)}")
    try:
        yield
    finally:
        if connection.connection is not None:
            with connection.cursor() as cursor:
                cursor.execute(f"PRAGMA busy_timeout = {int(configured * 1000)}")
