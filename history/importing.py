"""Importing the history of the Go ks-scheduler: its `key_node` table.

The old tool kept one table in its SQLite file, `key_node(id, podkey, nodename,
count)`: one row per (segment key, node) pair with its count. It had no unique
constraint, so repeated or concurrent runs left duplicate pairs, whose counts add
up. Rows with no key, no node or no count, with a count that is not a positive
whole number, with a key that is not one label segment (`labels.is_valid_segment`) or
a node that is not a Kubernetes node name (`nodenames.is_valid_node_name`) can
never score: they are left out and counted by reason.

Counts are written through `history.corrections` (adjustment reason `imported`),
so `audit_counts` stays clean, and each import is recorded as a HistoryImport
holding a hash of the pairs it imported: the same history imported twice changes
nothing the second time.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, cast

import orjson
from django.apps import AppConfig
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from history import corrections
from history.exceptions import OldHistoryError
from history.labels import is_valid_segment
from history.models import MAX_COUNT, CountAdjustment, HistoryImport, KeyNode
from history.nodenames import is_valid_node_name

logger = logging.getLogger(__name__)

OLD_TABLE = "key_node"
OLD_COLUMNS = ("id", "podkey", "nodename", "count")
# HistoryImport.source of the automatic import after `migrate`.
DATABASE_SOURCE = f"{OLD_TABLE} table in ks-scheduler's own database"
# The largest number a 64-bit integer column holds (HistoryImport.total).
BIGINT_MAX = 2**63 - 1
# Seconds to wait for a lock another writer holds on the old file.
SOURCE_LOCK_WAIT = 5.0
# Rows read from the old table at a time.
FETCH_ROWS = 10_000
# Rows, and pairs written, between two progress reports of a long import.
PROGRESS_ROWS = 500_000
# The length of HistoryImport.source.
SOURCE_MAX_LENGTH = 1024
# Serialises imports on PostgreSQL (several replicas run `migrate` at once); SQLite
# serialises writers already.
ADVISORY_LOCK = 0x6B73_696D_706F_7274

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


@dataclass(frozen=True)
class ImportOutcome:
    """What `import_old_history` did.

    `record` is the new HistoryImport (None for a dry run or when nothing was
    imported); `previous` the earlier import of the same history when that is why
    nothing was imported; `changed` the pairs whose count changed (or would).
    """

    record: HistoryImport | None
    previous: HistoryImport | None
    changed: int


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


def import_old_history(
    *,
    history: OldHistory,
    source: str,
    mode: str = HistoryImport.Mode.ADD,
    actor: str,
    dry_run: bool = False,
    again: bool = False,
    now: datetime | None = None,
    progress: Callable[[str], None] | None = None,
) -> ImportOutcome:
    """Write an old tool's history into KeyNode counts and record the import.

    `add` adds each pair's count to the existing one, `replace` sets the imported
    pairs to the old counts (other pairs are untouched). Either way the counts
    count as placements made at `now` for `warm` scoring. When the same history
    (equal `sha256`) was imported before, nothing is written unless `again`.
    A dry run writes nothing and reports what would change.
    """
    if mode not in HistoryImport.Mode.values:
        raise ValueError(f"unknown import mode {mode!r}")
    now = now or timezone.now()
    if dry_run:
        # Reads only: no transaction, so SQLite's write lock is not taken.
        previous = HistoryImport.objects.filter(sha256=history.sha256).first()
        if previous and not again:
            return ImportOutcome(record=None, previous=previous, changed=0)
        return ImportOutcome(
            record=None, previous=previous, changed=_would_change(history, mode)
        )
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK])
        # Checked under the lock, so two imports of one history cannot both pass.
        previous = HistoryImport.objects.filter(sha256=history.sha256).first()
        if previous and not again:
            return ImportOutcome(record=None, previous=previous, changed=0)
        write = (
            corrections.add_key_node_counts
            if mode == HistoryImport.Mode.ADD
            else corrections.set_key_node_counts
        )
        changed = write(
            counts=history.counts,
            actor=actor,
            reason=CountAdjustment.Reason.IMPORTED,
            now=now,
            progress=_written(history.pairs, progress),
        )
        record = HistoryImport.objects.create(
            source=source[:SOURCE_MAX_LENGTH],
            sha256=history.sha256,
            mode=mode,
            rows=history.rows,
            pairs=history.pairs,
            changed=changed,
            total=min(history.total, BIGINT_MAX),
            skipped=history.skipped_rows,
            skipped_reasons=history.skipped,
            actor=actor,
        )
    return ImportOutcome(record=record, previous=previous, changed=changed)


def _written(
    pairs: int, progress: Callable[[str], None] | None
) -> Callable[[int], None] | None:
    """A write's progress callback that tells `progress` every PROGRESS_ROWS pairs."""
    if progress is None:
        return None
    told = 0

    def tell(done: int) -> None:
        nonlocal told
        if done - told >= PROGRESS_ROWS or (done == pairs and told):
            told = done
            progress(f"wrote {done} of {pairs} pairs")

    return tell


def _would_change(history: OldHistory, mode: str) -> int:
    if mode == HistoryImport.Mode.ADD:
        return history.pairs
    stored = corrections.current_counts(pairs=history.counts)
    return sum(
        1 for pair, count in history.counts.items() if stored.get(pair, 0) != count
    )


def import_old_table_once(*, using: str = DEFAULT_DB_ALIAS) -> ImportOutcome | None:
    """Import the old tool's table from ks-scheduler's own database, once.

    Called after `migrate`. Does nothing (returns None) when there is no such
    table or an import of it was recorded; the table itself is left in place, so
    the old tool can still be started for a rollback. A table with other columns
    is logged at ERROR and left alone: the start-up goes on.
    """
    if using != DEFAULT_DB_ALIAS or not has_old_table(using=using):
        return None
    done = HistoryImport.objects.filter(source=DATABASE_SOURCE).first()
    if done:
        logger.info(
            "The Go ks-scheduler's %s table was imported on %s (import #%s); "
            "not importing it again",
            OLD_TABLE,
            done.imported_at.isoformat(timespec="seconds"),
            done.pk,
        )
        return None

    def progress(text: str) -> None:
        logger.info("Importing the Go ks-scheduler's history: %s", text)

    try:
        history = read_old_history_table(using=using, progress=progress)
    except OldHistoryError as exc:
        logger.error("Did not import the Go ks-scheduler's history: %s", exc)
        return None
    outcome = import_old_history(
        history=history, source=DATABASE_SOURCE, actor="migrate", progress=progress
    )
    if outcome.record is None:
        logger.info(
            "Found the Go ks-scheduler's %s table; its history was already imported "
            "(import #%s of %s)",
            OLD_TABLE,
            outcome.previous.pk if outcome.previous else "?",
            outcome.previous.source if outcome.previous else "?",
        )
        return outcome
    logger.info(
        "Imported the Go ks-scheduler's history from its %s table: %s rows read, "
        "%s pairs written, %s counts in total, %s rows skipped (%s); import #%s. "
        "The old table is left in place.",
        OLD_TABLE,
        history.rows,
        outcome.changed,
        history.total,
        history.skipped_rows,
        describe_skipped(history.skipped),
        outcome.record.pk,
    )
    return outcome


def describe_skipped(skipped: dict[str, int]) -> str:
    """`3 no key (NULL or empty), 1 negative count`, or `none`."""
    return ", ".join(f"{rows} {reason}" for reason, rows in skipped.items()) or "none"


def after_migrate(
    sender: AppConfig, using: str = DEFAULT_DB_ALIAS, **kwargs: Any
) -> None:
    """post_migrate receiver: the automatic import of the old tool's table.

    Runs after every `migrate` (and every test flush), so it first checks for the
    tables it needs with one introspection query.
    """
    with connections[using].cursor() as cursor:
        tables = set(connections[using].introspection.table_names(cursor))
    needed = {
        OLD_TABLE,
        HistoryImport._meta.db_table,
        KeyNode._meta.db_table,
        CountAdjustment._meta.db_table,
    }
    if needed <= tables:
        import_old_table_once(using=using)
