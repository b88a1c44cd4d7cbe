"""`import_history PATH`: import the Go ks-scheduler's history from its SQLite file.

The file is opened read-only. Exit 0 after an import, a dry run or a second run on
the same history (nothing written); exit 1 when the file is refused (not SQLite,
locked by another writer, no `key_node` table, other columns) or ks-scheduler's own
SQLite database stayed write-locked, with nothing written.
"""

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError

from history.exceptions import OldHistoryError
from history.importing import import_old_history
from history.models import HistoryImport
from history.old_history import OLD_TABLE, read_old_history_file
from history.writelock import configured_busy_timeout, is_write_lock_timeout


class Command(BaseCommand):
    help = (
        "Import the history of the Go ks-scheduler from its SQLite file "
        "(read-only). Duplicate pairs are summed, unusable rows skipped and "
        "reported, every change recorded as an 'imported' count adjustment."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="The old tool's SQLite file.")
        parser.add_argument(
            "--mode",
            choices=[mode.value for mode in HistoryImport.Mode],
            default=HistoryImport.Mode.ADD,
            help="add (default): add to the existing counts; replace: set the "
            "imported pairs to the old counts.",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Report, write nothing."
        )
        parser.add_argument(
            "--again",
            action="store_true",
            help="Import even if this history was imported before.",
        )

    def handle(
        self,
        *args: Any,
        path: str,
        mode: str,
        dry_run: bool,
        again: bool,
        **options: Any,
    ) -> None:
        started = time.monotonic()

        def progress(text: str) -> None:
            # Long imports (millions of rows) say how far they got as they go.
            self.stdout.write(f"  {time.monotonic() - started:.0f} s: {text}")
            self.stdout.flush()

        try:
            history = read_old_history_file(path, progress=progress)
        except OldHistoryError as exc:
            raise CommandError(f"Refused: {exc}. Nothing was written.") from exc
        self.stdout.write(
            f"Read {history.rows} rows from {path} ({OLD_TABLE}): {history.pairs} "
            f"pairs, {history.total} counts in total, {history.skipped_rows} rows "
            f"skipped."
        )
        for reason, rows in history.skipped.items():
            self.stdout.write(f"  skipped {rows}: {reason}")
        try:
            outcome = import_old_history(
                history=history,
                source=str(path),
                mode=mode,
                actor="import_history",
                dry_run=dry_run,
                again=again,
                progress=progress,
            )
        except OperationalError as exc:
            if not is_write_lock_timeout(exc):
                raise
            raise CommandError(
                f"Refused: ks-scheduler's database is locked by another writer "
                f"(waited {configured_busy_timeout():g} s, KSSCHED_SQLITE_TIMEOUT: "
                f"{exc}). Nothing was written; run the import again when the "
                f"watcher or the other writer lets go of it."
            ) from exc
        seconds = time.monotonic() - started
        previous = outcome.previous
        if previous and not again:
            self.stdout.write(
                f"Already imported on "
                f"{previous.imported_at.isoformat(timespec='seconds')} as import "
                f"#{previous.pk} ({previous.source}, mode {previous.mode}): nothing "
                f"written. Pass --again to import it again."
            )
            return
        if dry_run:
            self.stdout.write(
                f"Dry run (mode {mode}): would write {outcome.changed} pairs; "
                f"nothing written."
            )
            return
        if previous:
            self.stdout.write(
                f"Imported again (--again): import #{previous.pk} held the same "
                f"history."
            )
        record = outcome.record
        assert record is not None
        verb = "added" if mode == HistoryImport.Mode.ADD else "set"
        self.stdout.write(
            self.style.SUCCESS(
                f"Imported (mode {mode}): {outcome.changed} pairs written, "
                f"{history.total} counts {verb}, {history.skipped_rows} rows "
                f"skipped; import #{record.pk}, "
                f"{outcome.changed} count adjustments (reason imported), "
                f"in {seconds:.1f} s."
            )
        )
