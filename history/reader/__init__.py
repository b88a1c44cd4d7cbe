"""One read model for pipeline history, one reader per store.

`history_reader()` gives the reader for this thread's database connection: on
SQLite the per-thread cache (`sqlite_cache`), elsewhere the plain queries (`sql`).
`memory` holds an in-memory store for the simulator and tests.
"""

from __future__ import annotations

import threading

from django.db import connection

from history.reader.model import (
    NO_POLICIES,
    HistoryReader,
    LabelHistory,
    Policies,
    Revision,
    empty_history,
    rows_that_count,
)
from history.reader.sql import SqlReader
from history.reader.sqlite_cache import SqliteCacheReader

__all__ = [
    "NO_POLICIES",
    "HistoryReader",
    "LabelHistory",
    "Policies",
    "Revision",
    "empty_history",
    "history_reader",
    "rows_that_count",
]

_SQL = SqlReader()
_CACHES = threading.local()


def history_reader() -> HistoryReader:
    """The reader for this thread's database connection (Django's connections are
    per thread, and so are the SQLite caches)."""
    if connection.vendor != "sqlite":
        return _SQL
    cache = getattr(_CACHES, "cache", None)
    if cache is None:
        cache = _CACHES.cache = SqliteCacheReader()
    return cache
