"""The watcher's heartbeat file: touched while it makes progress, read by the probe.

Kept free of heavy imports so `manage.py watcher_health` starts fast.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from django.conf import settings

logger = logging.getLogger(__name__)


def default_max_age() -> float:
    """Heartbeat age beyond which the watcher counts as stuck."""
    read_timeout: float = settings.KSSCHED_WATCH_READ_TIMEOUT
    backoff_cap: float = settings.KSSCHED_WATCH_BACKOFF_CAP
    return read_timeout + backoff_cap + 30


# Seconds between two touches of the file: its age is read in tens of seconds.
INTERVAL = 1.0


class Heartbeat:
    """A file whose modification time says when the watcher last made progress."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._warned = False
        self._made = False
        self._last = -INTERVAL

    def beat(self) -> None:
        """Touch the file (at most once every INTERVAL seconds)."""
        if self.path is None:
            return
        now = time.monotonic()
        if now - self._last < INTERVAL:
            return
        try:
            if not self._made:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._made = True
            self.path.touch()
            self._last = now
        except OSError as exc:
            if not self._warned:
                logger.warning("Cannot touch heartbeat file %s: %s", self.path, exc)
                self._warned = True


def heartbeat_age(path: str | Path, now: float | None = None) -> float | None:
    """Seconds since the heartbeat file was touched; None if it does not exist."""
    try:
        mtime = Path(path).stat().st_mtime
    except OSError:
        return None
    return max(0.0, (time.time() if now is None else now) - mtime)
