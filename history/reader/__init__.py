"""One read model for pipeline history, one reader per store.

`history_reader()` gives the process's reader: the process cache (`cache`, fed by
its store's change feed: `sqlite_cache` or `postgres_cache`), shared by every
thread and greenlet, or the plain statement (`sql`) when KSSCHED_HISTORY_CACHE is
off. `memory` holds an in-memory store for the simulator and tests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import connection

from history.reader.cache import CachedReader
from history.reader.memo import UNSETTLED, NodeRule, NodeValues, Unsettled
from history.reader.model import (
    NO_POLICIES,
    HistoryReader,
    LabelHistory,
    Policies,
    empty_history,
    rows_that_count,
)
from history.reader.postgres_cache import PostgresCacheReader
from history.reader.sql import SqlReader
from history.reader.sqlite_cache import SqliteCacheReader

__all__ = [
    "NO_POLICIES",
    "UNSETTLED",
    "HistoryReader",
    "LabelHistory",
    "NodeRule",
    "NodeValues",
    "Policies",
    "Unsettled",
    "empty_history",
    "forget_caches",
    "history_reader",
    "reading_ahead",
    "rows_that_count",
]

_SQL = SqlReader()


class _ProcessCaches:
    """The process cache of each database vendor, made on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.caches: dict[str, CachedReader] = {}

    def get(self, vendor: str) -> CachedReader | None:
        cache = self.caches.get(vendor)
        if cache is not None or vendor not in _STORES:
            return cache
        with self.lock:
            if vendor not in self.caches:
                self.caches[vendor] = _STORES[vendor]()
            return self.caches[vendor]

    def forget(self) -> None:
        """Start every cache over (tests: a new database is a new process)."""
        with self.lock:
            self.caches.clear()


_STORES: dict[str, type[CachedReader]] = {
    "sqlite": SqliteCacheReader,
    "postgresql": PostgresCacheReader,
}
_PROCESS = _ProcessCaches()


def history_reader() -> HistoryReader:
    """The process's reader for the database it reads (see the module's doc)."""
    if not settings.KSSCHED_HISTORY_CACHE:
        return _SQL
    return _PROCESS.get(connection.vendor) or _SQL


def forget_caches() -> None:
    """Drop the process caches: the next read starts a cold one."""
    _PROCESS.forget()


@contextmanager
def reading_ahead() -> Iterator[None]:
    """A block that reads history once it has done its own work (a view parsing
    the request body, then scoring): the cache's sync starts on entry, so on
    PostgreSQL its round trip overlaps that work. Whatever the block does, the
    connection is left idle on exit."""
    reader = history_reader()
    if not isinstance(reader, CachedReader):
        yield
        return
    reader.look_ahead()
    try:
        yield
    finally:
        reader.settle()


def after_request(**kwargs: object) -> None:
    """`request_finished` receiver: the reply is sent, so the process cache may do
    its housekeeping (see `CachedReader.after_request`) without delaying it."""
    cache = _PROCESS.caches.get(connection.vendor)
    if cache is not None and connection.connection is not None:
        cache.after_request()
