"""Reading the Go ks-scheduler's history: its `key_node` table, summed into pairs.

From the old tool's SQLite file (read-only) or from ks-scheduler's own database;
`history.importing` writes what is read here into the counts.

The old tool kept one table in its SQLite file, `key_node(id, podkey, nodename,
count)`: one row per (segment key, node) pair with its count. It had no unique
constraint, so repeated or concurrent runs left duplicate pairs, whose counts add
up. Rows with no key, no node or no count, with a count that is not a positive
whole number, with a key that is not one label segment (`labels.is_valid_segment`) or
a node that is not a Kubernetes node name (`nodenames.is_valid_node_name`) can
never score: they are left out and counted by reason.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import cast

import orjson
from django.db import DEFAULT_DB_ALIAS, connections

from history.exceptions import OldHistoryError
from history.labels import is_valid_segment
from history.models import MAX_COUNT
from history.nodenames import is_valid_node_name

OLD_TABLE = "key_node"
OLD_COLUMNS = ("id", "podkey", "nodename", "count")
# HistoryImport.source of the automatic import after `migrate`.
DATABASE_SOURCE = f"{OLD_TABLE} table in ks-scheduler's own database"
# Seconds to wait for a lock another writer holds on the old file.
SOURCE_LOCK_WAIT = 5.0
# Rows read from the old table at a time.
FETCH_ROWS = 10_000
# Rows, and pairs written (`history.importing`), between two progress reports of a
# long import.
PROGRESS_ROWS = 500_000

# Why a row is left out, as reported.
NO_KEY = "no key (NULL or empty)"
BAD_KEY = "key is not one label segment ('-', other characters, or over 63)"
NO_NODE = "no node (NULL or empty)"
BAD_NODE = (
    "node is not a Kubernetes node name (lower-case DNS-1123 subdomain, at most 253)"
)
NO_COUNT = "no count (NULL)"
BAD_COUNT = "count is not a whole number"
NEGATIVE_COUNT = "negative count"
ZERO_COUNT = "count 0 (no history)"
TOO_LARGE = "pair total over the largest count"


@dataclass
class OldHistory:
    """What an old-tool table holds: the usable pairs summed, and what was left out.

    `counts` maps (key, node) to the sum of its rows' counts (every sum > 0);
    `skipped` maps a reason to the number of rows left out for it. Filled once by
    `summarize_old_rows`, then read only (`sha256` is computed once).
    """

    rows: int = 0
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def pairs(self) -> int:
        return len(self.counts)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def skipped_rows(self) -> int:
        return sum(self.skipped.values())

    @cached_property
    def sha256(self) -> str:
        """A hash of the summed pairs: equal for the same history, whatever the
        row order, duplicates or skipped rows.

        The SHA-256 of the JSON list of `[[key, node], count]` in pair order,
        hashed item by item so that the JSON of millions of pairs is never held.
        """
        digest = hashlib.sha256(b"[")
        for position, pair in enumerate(sorted(self.counts)):
            if position:
                digest.update(b",")
            digest.update(orjson.dumps((pair, self.counts[pair])))
        digest.update(b"]")
        return digest.hexdigest()


def summarize_old_rows(
    read_rows: Callable[[], Iterable[Sequence[object]]],
    *,
    progress: Callable[[str], None] | None = None,
) -> OldHistory:
    """Sum the (podkey, nodename, count) rows of `read_rows()` per pair, leaving out
    unusable rows; `progress` is told every PROGRESS_ROWS rows how far it got.

    Memory grows with the distinct usable pairs, not with the rows: rows are taken
    as they come, each key and node name is held once however many rows repeat
    it, and one sum is kept per pair. Only when a pair sums over MAX_COUNT (a
    damaged file) is `read_rows()` called a second time, to count that pair's rows.
    """
    history = OldHistory()
    counts: dict[tuple[str, str], int] = {}
    names: dict[str, str] = {}
    skipped: Counter[str] = Counter()
    for key, node, count in read_rows():
        history.rows += 1
        reason = _unusable(key, node, count)
        if reason:
            skipped[reason] += 1
        else:
            # _unusable proved the types. Each row brings its own copy of the
            # names: one copy of each is kept.
            key = names.setdefault(cast(str, key), cast(str, key))
            node = names.setdefault(cast(str, node), cast(str, node))
            counts[key, node] = counts.get((key, node), 0) + cast(int, count)
        if progress is not None and history.rows % PROGRESS_ROWS == 0:
            progress(f"read {history.rows} rows, {len(counts)} pairs so far")
    over = {pair for pair, total in counts.items() if total > MAX_COUNT}
    if over:
        for pair in over:
            del counts[pair]
        skipped[TOO_LARGE] = sum(
            1
            for key, node, count in read_rows()
            if _unusable(key, node, count) is None and (key, node) in over
        )
    history.counts = counts
    history.skipped = dict(skipped.most_common())
    return history


def _unusable(key: object, node: object, count: object) -> str | None:
    """Why a row cannot be imported, or None when it can."""
    if key is None or key == "":
        return NO_KEY
    # The Go tool wrote segments only. A label-path key (`java$`, `jenkins-*`) would
    # make a pipeline look warm where it never ran: it comes from no real label.
    if not is_valid_segment(key):
        return BAD_KEY
    if node is None or node == "":
        return NO_NODE
    if not is_valid_node_name(node):
        return BAD_NODE
    if count is None:
        return NO_COUNT
    # SQLite keeps whatever was written: text that is not a number, or a real.
    if isinstance(count, bool) or not isinstance(count, int):
        return BAD_COUNT
    if count < 0:
        return NEGATIVE_COUNT
    if count == 0:
        return ZERO_COUNT
    return None


def _check_columns(columns: Iterable[str], where: str) -> None:
    found = tuple(column.lower() for column in columns)
    if sorted(found) != sorted(OLD_COLUMNS):
        raise OldHistoryError(
            f"{where}: the {OLD_TABLE} table has the columns ({', '.join(found)}), "
            f"not the Go ks-scheduler's ({', '.join(OLD_COLUMNS)})"
        )


def read_old_history_file(
    path: str | Path, *, progress: Callable[[str], None] | None = None
) -> OldHistory:
    """Read an old-tool SQLite file, read-only (it is never modified).

    Raises OldHistoryError when the file is missing, is not a SQLite database, has
    no `key_node` table, or that table has other columns.
    """
    file = Path(path)
    if not file.is_file():
        raise OldHistoryError(f"{path}: no such file")
    # mode=ro: SQLite opens the file read-only and never creates or changes it.
    uri = f"{file.resolve().as_uri()}?mode=ro"
    try:
        database = sqlite3.connect(uri, uri=True, timeout=SOURCE_LOCK_WAIT)
    except sqlite3.Error as exc:
        raise OldHistoryError(f"{path}: cannot open it ({exc})") from exc
    try:
        tables = {
            name.lower(): name
            for (name,) in database.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )
        }
        if OLD_TABLE not in tables:
            raise OldHistoryError(
                f"{path}: no {OLD_TABLE} table, so not a Go ks-scheduler database"
            )
        table = tables[OLD_TABLE]
        columns = [row[1] for row in database.execute(f'PRAGMA table_info("{table}")')]
        _check_columns(columns, str(path))
        return summarize_old_rows(
            lambda: database.execute(
                f'SELECT podkey, nodename, "count" FROM "{table}"'
            ),
            progress=progress,
        )
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise OldHistoryError(f"{path}: cannot read it ({exc})") from exc
        raise OldHistoryError(
            f"{path}: locked by another writer for over {SOURCE_LOCK_WAIT:g} s "
            f"({exc}); stop the old tool, or import a copy of the file"
        ) from exc
    except sqlite3.DatabaseError as exc:
        raise OldHistoryError(f"{path}: not a SQLite database ({exc})") from exc
    finally:
        database.close()


def has_old_table(*, using: str = DEFAULT_DB_ALIAS) -> bool:
    """True when ks-scheduler's own database holds the old tool's table."""
    with connections[using].cursor() as cursor:
        return OLD_TABLE in connections[using].introspection.table_names(cursor)


def read_old_history_table(
    *,
    using: str = DEFAULT_DB_ALIAS,
    progress: Callable[[str], None] | None = None,
) -> OldHistory:
    """Read the old tool's table from ks-scheduler's own database (the same file
    when the old tool's DATA_PATH is kept). Raises OldHistoryError when its columns
    are not the old tool's."""
    database = connections[using]
    with database.cursor() as cursor:
        description = database.introspection.get_table_description(cursor, OLD_TABLE)
        _check_columns([column.name for column in description], DATABASE_SOURCE)
        columns: tuple[str, ...] = ("podkey", "nodename", '"count"')
        if database.vendor == "sqlite":
            # Django reads SQLite columns through converters chosen by the declared
            # type: a `date` column holding text fails, a `timestamp` one turns
            # numbers into NULL. An expression has no declared type, and unary +
            # returns any SQLite value unchanged: the raw values, as in the file.
            columns = tuple(f"+{column}" for column in columns)
    select = f"SELECT {', '.join(columns)} FROM {OLD_TABLE}"

    def read_rows() -> Iterator[Sequence[object]]:
        # On PostgreSQL a server-side cursor (unless DISABLE_SERVER_SIDE_CURSORS):
        # the rows come FETCH_ROWS at a time there too.
        with database.chunked_cursor() as cursor:
            cursor.execute(select)
            while rows := cursor.fetchmany(FETCH_ROWS):
                yield from rows

    return summarize_old_rows(read_rows, progress=progress)
