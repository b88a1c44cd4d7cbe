"""Housekeeping, done by the watcher that holds the lease (one replica). Daily:
remove the rows of nodes gone longer than KSSCHED_NODE_RETENTION_DAYS
(`history.audit.prune_gone_nodes`), and the ledger rows of pods that ended longer
ago than KSSCHED_LEDGER_RETENTION_DAYS (`history.audit.prune_placements`, which
keeps every count). Hourly, with KSSCHED_WORKSPACE_DEPTH=auto: measure the depth
from which workspaces look gone (`history.workspaces.learn_depth`), which the
extender processes then read. A failure is logged and tried again next time; it
never stops the streams.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from history import audit, workspaces

logger = logging.getLogger(__name__)

# The first run waits this long after the streams start (a restart loop does no
# housekeeping), then one runs every EVERY seconds; the depth is measured every
# LEARN_EVERY seconds.
FIRST_AFTER = 600.0
EVERY = 86400.0
LEARN_EVERY = 3600.0


def prune_gone_nodes_now() -> int:
    """One round: the rows of nodes gone longer than the retention period."""
    days = settings.KSSCHED_NODE_RETENTION_DAYS
    if days <= 0:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    removed = audit.prune_gone_nodes(before=cutoff, actor="watch_pods")
    if removed:
        logger.info("Removed %d history rows of nodes gone since %s", removed, cutoff)
    return removed


def prune_ledger_now() -> int:
    """One round: the ledger rows of pods that ended before the retention period."""
    days = settings.KSSCHED_LEDGER_RETENTION_DAYS
    if days <= 0:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    removed = audit.prune_placements(before=cutoff, actor="watch_pods")
    if removed:
        logger.info(
            "Pruned %d ledger rows of pods that ended before %s", removed, cutoff
        )
    return removed


def learn_depth_now() -> int:
    """One round: the workspace depth, with KSSCHED_WORKSPACE_DEPTH=auto."""
    if settings.KSSCHED_WORKSPACE_DEPTH != "auto":
        return 0
    learned = workspaces.learn_depth()
    logger.info("Workspace depth measured: %s", learned)
    return 1


def run(
    until: Callable[[], bool],
    wake: threading.Event,
    *,
    first_after: float = FIRST_AFTER,
    every: float = EVERY,
    learn_every: float = LEARN_EVERY,
) -> None:
    """Housekeeping rounds until `until()`; `wake` is set to stop waiting early."""
    delay = first_after
    daily_due = 0.0
    while not until():
        if wake.wait(delay) and until():
            return
        now = time.monotonic()
        if now >= daily_due:
            _attempt(prune_gone_nodes_now)
            _attempt(prune_ledger_now)
            daily_due = now + every
        _attempt(learn_depth_now)
        delay = min(every, learn_every)


def _attempt(work: Callable[[], int]) -> None:
    """One housekeeping job; a database failure waits for the next round."""
    try:
        work()
    except DatabaseError as exc:
        logger.warning("Housekeeping failed, tried again later: %s", exc)
    except Exception:  # a bug in one job must not stop the others
        logger.exception("Housekeeping job %s failed", getattr(work, "__name__", work))
    finally:
        close_old_connections()


def start(until: Callable[[], bool], wake: threading.Event) -> threading.Thread:
    thread = threading.Thread(
        target=run, args=(until, wake), name="housekeeping", daemon=True
    )
    thread.start()
    return thread
