"""The workspace depth `warm` scores with (KSSCHED_WORKSPACE_DEPTH, docs/scoring.md).

A number is used as set (0: off). With `auto`, each process uses the depth the
watcher last measured from the ledger's outcomes (`models.LearnedDepth`, written
hourly by the watcher that holds the lease): it reads that one row at most every
KSSCHED_WORTH_REFRESH_SECONDS, after a reply is sent (`after_request`), never
before one, once it has scored. Until its first read, and while no depth is
measured (too few outcomes, or none looks gone), the depth is 0: no workspace
counts as gone.
"""

from __future__ import annotations

from django.conf import settings

from history.models import LearnedDepth
from history.timed_read import TimedRead


class DepthFeed(TimedRead):
    """The depth in use, and the measurement it came from (with `auto`)."""

    def __init__(self) -> None:
        super().__init__()
        self.learned: LearnedDepth | None = None

    def current(self) -> int:
        """The depth to score with now (never reads the database)."""
        setting = settings.KSSCHED_WORKSPACE_DEPTH
        if setting != "auto":
            return int(setting)
        self.wanted = True
        learned = self.learned
        return 0 if learned is None or learned.depth is None else learned.depth

    def _read(self) -> None:
        self.learned = LearnedDepth.objects.filter(pk=1).first()


_PROCESS = DepthFeed()


def process_depth() -> DepthFeed:
    """This process's feed."""
    return _PROCESS


def forget_depth() -> None:
    """Start the process's feed over (tests: a new database is a new process)."""
    global _PROCESS
    _PROCESS = DepthFeed()


def depth_text() -> str:
    """The depth in use, for the admin's overview: the setting, and with `auto` the
    watcher's last measurement (read now, as a process reads it)."""
    setting = settings.KSSCHED_WORKSPACE_DEPTH
    if setting != "auto":
        if not int(setting):
            return "off: KSSCHED_WORKSPACE_DEPTH is 0, no workspace counts as gone"
        return f"{setting}, as KSSCHED_WORKSPACE_DEPTH sets it"
    learned = LearnedDepth.objects.filter(pk=1).first()
    if learned is None:
        return (
            "auto, not measured yet: the watcher that holds the lease measures it "
            "every hour; until then no workspace counts as gone"
        )
    when = f"measured {learned.measured_at:%Y-%m-%d %H:%M} UTC"
    if learned.depth is None:
        none = f"auto, none named ({learned.reason})"
        return f"{none}: no workspace counts as gone; {when}"
    return f"auto: {learned.depth}, {when} from the ledger's outcomes"


def after_request(**kwargs: object) -> None:
    """`request_finished` receiver: once a request has scored with a learned
    depth, read it again when it is time, the reply sent."""
    if settings.KSSCHED_WORKSPACE_DEPTH == "auto" and _PROCESS.wanted:
        _PROCESS.refresh()
