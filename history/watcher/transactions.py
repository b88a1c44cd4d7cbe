"""One database transaction per unit of watcher work, and what a failure means.

- A missing table or another schema problem is fatal (WatcherFatalError): the
  process exits non-zero and Kubernetes shows why.
- A transient error ("database is locked", a lost connection) is retried after a
  backoff for as long as it takes.
- A data error (DataError, or an IntegrityError the ledger does not handle itself)
  fails the same way every time: with `bounded`, it is retried DATA_ERROR_ATTEMPTS
  times in all, then raised as Unwritable so the caller can skip that one event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    InterfaceError,
    ProgrammingError,
    close_old_connections,
    connection,
    transaction,
)

from history.exceptions import WatcherFatalError
from history.watcher import metrics

logger = logging.getLogger(__name__)

DATA_ERROR_ATTEMPTS = 3


class Unwritable(Exception):
    """The same work failed with a data error every time it was tried."""

    def __init__(self, error: DatabaseError) -> None:
        super().__init__(str(error))
        self.error = error


def in_transaction(
    work: Callable[[], Any],
    *,
    stream: str,
    sleep: Callable[[float], None],
    base: float,
    cap: float,
    bounded: bool = False,
) -> Any:
    """Run `work` in one transaction; return its result once it has committed.

    Only the committed attempt's result comes back, so nothing a rolled-back attempt
    did is counted. Between attempts: `sleep(delay)`, from `base` doubling to `cap`
    (the caller's sleep touches the heartbeat and ends on shutdown).
    """
    delay = base
    attempts = 0
    while True:
        close_old_connections()
        attempts += 1
        try:
            with transaction.atomic():
                return work()
        except (ProgrammingError, WatcherFatalError) as exc:
            raise WatcherFatalError(f"database schema problem: {exc}") from exc
        except (DataError, IntegrityError) as exc:
            if bounded and attempts >= DATA_ERROR_ATTEMPTS:
                raise Unwritable(exc) from exc
            error: Exception = exc
        except (DatabaseError, InterfaceError) as exc:
            if "no such table" in str(exc):
                raise WatcherFatalError(f"database schema problem: {exc}") from exc
            error = exc
        metrics.DB_RETRIES.inc()
        logger.warning(
            "Database error on %s (%s); retrying in %.1f s", stream, error, delay
        )
        connection.close()
        sleep(delay)
        delay = min(cap, delay * 2)
