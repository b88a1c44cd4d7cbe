"""One read model for pipeline history, one reader per store.

`history_reader()` gives the reader for this thread's database connection: the
per-thread cache of its store (`sqlite_cache`, `postgres_cache`, both built on
`cache`), or the plain statement (`sql`) when KSSCHED_HISTORY_CACHE is off.
`memory` holds an in-memory store for the simulator and tests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import connection

from history.reader.cache import CachedReader
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
    "HistoryReader",
    "LabelHistory",
    "Policies",
    "empty_history",
    "history_reader",
    "reading_ahead",
    "rows_that_count",
]

_SQL = SqlReader()
_CACHES = threading.local()


def history_reader() -> HistoryReader:
    """The reader for this thread's database connection (Django's connections are
    per thread, and so are the SQLite caches)."""
    if not settings.KSSCHED_HISTORY_CACHE:
        return _SQL
    cache: CachedReader | None = getattr(_CACHES, connection.vendor, None)
    if cache is None:
        if connection.vendor == "sqlite":
            cache = SqliteCacheReader()
        elif connection.vendor == "postgresql":
            cache = PostgresCacheReader()
        else:
            return _SQL
        setattr(_CACHES, connection.vendor, cache)
    return cache


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
    """`request_finished` receiver: the reply is sent, so this thread's cache may
    do its housekeeping (see `CachedReader.after_request`) without delaying it."""
    cache: CachedReader | None = getattr(_CACHES, connection.vendor, None)
    if cache is not None and connection.connection is not None:
        cache.after_request()
