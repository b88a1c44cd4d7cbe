"""What a process reads from the database now and then, to score with: at most every
KSSCHED_WORTH_REFRESH_SECONDS, after a reply is sent (a `request_finished`
receiver), never before one, and only once scoring has asked for it (`wanted`).
The book of what warmth is worth (`worth_feed`) and the learned workspace depth
(`depth_feed`) are read so."""

from __future__ import annotations

import threading
import time

from django.conf import settings
from django.db import DatabaseError


class TimedRead:
    """A value read again by `_read` when `refresh` finds it is time."""

    def __init__(self) -> None:
        self.reading = threading.Lock()  # one read at a time
        self.next_refresh = 0.0
        # Set when scoring asked for the value: only then does a reply's end read
        # (a process that never scores never reads).
        self.wanted = False

    def refresh(self, *, force: bool = False, now: float | None = None) -> bool:
        """Read again, if it is time (or `force`). False when it was not time or
        the database could not be read."""
        now = time.monotonic() if now is None else now
        if not force and now < self.next_refresh:
            return False
        if not self.reading.acquire(blocking=force):
            return False  # another thread is reading
        try:
            self.next_refresh = now + settings.KSSCHED_WORTH_REFRESH_SECONDS
            try:
                self._read()
            except DatabaseError:
                return False
            return True
        finally:
            self.reading.release()

    def _read(self) -> None:
        raise NotImplementedError
