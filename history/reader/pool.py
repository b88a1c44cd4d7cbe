"""The pipeline pool: the nodes pipeline pods can run on, as far as history knows.

Those with a KeyNode row placed in the last `days` (rows are valued at their last
placement, `decayed_at`) and those the watcher first saw, or saw replaced, since
then: idle nodes count too, and nodes gone for longer drop out. The webhook scores
the pool with the nodes that have history for a label, so its load rule compares a
node with the pool's mean as prioritize compares it with kube-scheduler's
candidates.

It changes as nodes come and go, so it is read at most every POOL_SECONDS (`Pool`):
from the database for every reader of it (`database_pool`), from the simulator's
memory for that store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from django.db.models import Q

from history.models import KeyNode, NodeRecord

# The pool is read again at most this often.
POOL_SECONDS = 60.0
DAY = 86400.0


def read_pool(since: float) -> list[str]:
    """The pool as of `since` (Unix seconds), read from the database, sorted."""
    seen_since = datetime.fromtimestamp(since, tz=UTC)
    placed = (
        KeyNode.objects.filter(count__gt=0, decayed_at__gte=since)
        .order_by()
        .values_list("node", flat=True)
        .distinct()
    )
    seen = NodeRecord.objects.filter(
        Q(first_seen_at__gte=seen_since) | Q(updated__gte=seen_since)
    ).values_list("name", flat=True)
    return sorted(set(placed) | set(seen))


class Pool:
    """A pool read by `read(since)` at most every POOL_SECONDS (and again when the
    clock went backwards)."""

    def __init__(self, read: Callable[[float], Iterable[str]]):
        self.read = read
        self.lock = threading.Lock()
        self.read_at: float | None = None
        self.nodes: tuple[str, ...] = ()

    def at(self, *, now: float, days: float) -> tuple[str, ...]:
        """The nodes placed, first seen or replaced in the `days` before `now`."""
        with self.lock:
            if self.read_at is None or not 0 <= now - self.read_at < POOL_SECONDS:
                self.nodes = tuple(self.read(now - days * DAY))
                self.read_at = now
            return self.nodes

    def clear(self) -> None:
        """Forget the pool: the next call reads it."""
        self.read_at = None
        self.nodes = ()


# Every reader of the database shares it (per process).
database_pool = Pool(read_pool)
