"""Importing the history of the Go ks-scheduler: what `history.old_history` read
from its `key_node` table, written into the counts and recorded.

Counts are written through `history.corrections` (adjustment reason `imported`),
so `audit_counts` stays clean, and each import is recorded as a HistoryImport
holding a hash of the pairs it imported: the same history imported twice changes
nothing the second time. After `migrate`, the old table in ks-scheduler's own
database is imported once (`after_migrate`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.apps import AppConfig
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from history import corrections, old_history
from history.exceptions import OldHistoryError
from history.models import CountAdjustment, HistoryImport, KeyNode

logger = logging.getLogger(__name__)

# The largest number a 64-bit integer column holds (HistoryImport.total).
BIGINT_MAX = 2**63 - 1
# The length of HistoryImport.source.
SOURCE_MAX_LENGTH = 1024
# Serialises imports on PostgreSQL (several replicas run `migrate` at once); SQLite
# serialises writers already.
ADVISORY_LOCK = 0x6B73_696D_706F_7274


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


def import_old_history(
    *,
    history: old_history.OldHistory,
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
    """A write's progress callback that tells `progress` every
    `old_history.PROGRESS_ROWS` pairs."""
    if progress is None:
        return None
    told = 0

    def tell(done: int) -> None:
        nonlocal told
        if done - told >= old_history.PROGRESS_ROWS or (done == pairs and told):
            told = done
            progress(f"wrote {done} of {pairs} pairs")

    return tell


def _would_change(history: old_history.OldHistory, mode: str) -> int:
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
    if using != DEFAULT_DB_ALIAS or not old_history.has_old_table(using=using):
        return None
    done = HistoryImport.objects.filter(source=old_history.DATABASE_SOURCE).first()
    if done:
        logger.info(
            "The Go ks-scheduler's %s table was imported on %s (import #%s); "
            "not importing it again",
            old_history.OLD_TABLE,
            done.imported_at.isoformat(timespec="seconds"),
            done.pk,
        )
        return None

    def progress(text: str) -> None:
        logger.info("Importing the Go ks-scheduler's history: %s", text)

    try:
        history = old_history.read_old_history_table(using=using, progress=progress)
    except OldHistoryError as exc:
        logger.error("Did not import the Go ks-scheduler's history: %s", exc)
        return None
    outcome = import_old_history(
        history=history,
        source=old_history.DATABASE_SOURCE,
        actor="migrate",
        progress=progress,
    )
    if outcome.record is None:
        logger.info(
            "Found the Go ks-scheduler's %s table; its history was already imported "
            "(import #%s of %s)",
            old_history.OLD_TABLE,
            outcome.previous.pk if outcome.previous else "?",
            outcome.previous.source if outcome.previous else "?",
        )
        return outcome
    logger.info(
        "Imported the Go ks-scheduler's history from its %s table: %s rows read, "
        "%s pairs written, %s counts in total, %s rows skipped (%s); import #%s. "
        "The old table is left in place.",
        old_history.OLD_TABLE,
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
        old_history.OLD_TABLE,
        HistoryImport._meta.db_table,
        KeyNode._meta.db_table,
        CountAdjustment._meta.db_table,
    }
    if needed <= tables:
        import_old_table_once(using=using)
