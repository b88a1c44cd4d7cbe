"""Exceptions that callers in ks-scheduler catch."""


class OldHistoryError(Exception):
    """The Go ks-scheduler's history cannot be read: not SQLite, no `key_node`
    table, or a table with other columns. Nothing was written."""
