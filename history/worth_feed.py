"""A process's book of what warmth is worth (`history.worth`), fed from the ledger.

One book per process, shared by its threads and greenlets. It starts from the
successful pods that ended in the last KSSCHED_WORTH_DAYS (at most `FIRST_ROWS`,
the newest), then reads only the pods that ended since, at most every
KSSCHED_WORTH_REFRESH_SECONDS. The web processes refresh after a reply is sent
(`after_request`), never before one, once they have scored with the book (a
filter call or an admin page reads nothing): until the first refresh, every
pipeline gets weight 1, today's pull. The admin's pipeline page refreshes before
it shows.

A pod's outcome is written when the watcher sees it end, normally with its
`finished_at`; pods whose outcome comes later than `OVERLAP` after their end are
missed (the ledger's outcomes report still counts them).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from django.conf import settings

from history.models import Placement
from history.timed_read import TimedRead
from history.worth import Estimate, WorthBook
from history.worth_samples import WARMTHS

# The most ended pods the first read takes (the newest of the window).
FIRST_ROWS = 100_000
# How far back each later read looks again, for outcomes written after the pod's end.
OVERLAP = timedelta(minutes=10)


class LedgerWorth(TimedRead):
    """The book and where the ledger was last read up to (`refresh` reads on)."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()  # the book
        self.book = WorthBook()
        self.read_until: datetime | None = None
        self.seen: dict[int, datetime] = {}

    def estimate(self, label: str) -> Estimate:
        """The label's estimate from the book as last read (never reads)."""
        self.wanted = True
        with self.lock:
            return self.book.estimate(label)

    def weight(self, label: str) -> float:
        """The weight `warm` scales the label's pull by (1: KSSCHED_WORTH off)."""
        if settings.KSSCHED_WORTH != "auto":
            return 1.0
        return self.estimate(label).weight

    def _read(self) -> None:
        ended = Placement.objects.filter(
            outcome=Placement.Outcome.SUCCEEDED,
            warmth__in=WARMTHS,
            startup_seconds__isnull=False,
            run_seconds__isnull=False,
            finished_at__isnull=False,
        )
        columns = ("pk", "label", "warmth", "startup_seconds", "run_seconds")
        if self.read_until is None:
            since = datetime.now(UTC) - timedelta(days=settings.KSSCHED_WORTH_DAYS)
            newest = list(
                ended.filter(finished_at__gte=since)
                .order_by("-finished_at", "-pk")
                .values_list(*columns, "finished_at")[:FIRST_ROWS]
            )
            newest.reverse()
            rows = newest
        else:
            rows = list(
                ended.filter(finished_at__gte=self.read_until - OVERLAP)
                .order_by("finished_at", "pk")
                .values_list(*columns, "finished_at")
            )
        # Read first, then added under the book's lock: readers wait for the adds
        # only, never for the database.
        latest = self.read_until
        with self.lock:
            for pk, label, warmth, startup, run, finished in rows:
                if pk in self.seen:
                    continue
                self.seen[pk] = finished
                self.book.add(label, warmth, startup, run)
                latest = finished if latest is None or finished > latest else latest
            if rows:
                # Every estimate worked out here, after a reply: never while scoring.
                self.book.settle()
        if latest is None:
            latest = datetime.now(UTC)
        self.read_until = latest
        horizon = latest - OVERLAP
        self.seen = {pk: at for pk, at in self.seen.items() if at >= horizon}


_PROCESS = LedgerWorth()


def process_worth() -> LedgerWorth:
    """This process's book."""
    return _PROCESS


def forget_worth() -> None:
    """Start the process's book over (tests: a new database is a new process)."""
    global _PROCESS
    _PROCESS = LedgerWorth()


def after_request(**kwargs: object) -> None:
    """`request_finished` receiver: once a request has scored with the book,
    refresh it when it is time, the reply sent."""
    if settings.KSSCHED_WORTH == "auto" and _PROCESS.wanted:
        _PROCESS.refresh()
