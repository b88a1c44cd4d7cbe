"""How the watcher selects, counts and times out, and how it backs off."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings


@dataclass
class Options:
    """How the watcher selects, counts and times out; defaults come from settings."""

    scheduler_name: str = ""
    # Count pods of every scheduler (webhook mode), not only `scheduler_name`'s.
    any_scheduler: bool = False
    pipeline_label: str = ""
    namespace: str | None = None
    count_when: str = "bound"
    server_timeout: tuple[int, int] = (300, 600)
    page_size: int = 500
    backoff_base: float = 0.8
    backoff_cap: float = 30.0
    backoff_reset: float = 120.0
    max_events: int | None = None

    @classmethod
    def from_settings(cls, **overrides: Any) -> Options:
        values = dict(
            scheduler_name=settings.KSSCHED_SCHEDULER_NAME,
            any_scheduler=settings.KSSCHED_WATCH_ANY_SCHEDULER,
            pipeline_label=settings.KSSCHED_PIPELINE_LABEL,
            server_timeout=(
                settings.KSSCHED_WATCH_SERVER_TIMEOUT_MIN,
                max(
                    settings.KSSCHED_WATCH_SERVER_TIMEOUT_MIN + 1,
                    settings.KSSCHED_WATCH_SERVER_TIMEOUT_MAX,
                ),
            ),
            page_size=settings.KSSCHED_WATCH_LIST_PAGE,
            backoff_base=settings.KSSCHED_WATCH_BACKOFF_BASE,
            backoff_cap=settings.KSSCHED_WATCH_BACKOFF_CAP,
            backoff_reset=settings.KSSCHED_WATCH_BACKOFF_RESET,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


class Backoff:
    """Exponential backoff with jitter: base·2ⁿ, at least base, at most cap.

    The attempt counter resets once the stream has been healthy for `reset` seconds
    since the last failure.
    """

    def __init__(
        self,
        *,
        base: float,
        cap: float,
        reset: float,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base, self.cap, self.reset = base, cap, reset
        self.attempts = 0
        self._rng = rng
        self._clock = clock
        self._last_failure: float | None = None

    def next_delay(self) -> float:
        now = self._clock()
        if self._last_failure is not None and now - self._last_failure > self.reset:
            self.attempts = 0
        self._last_failure = now
        delay: float = min(self.cap, self.base * 2**self.attempts)
        self.attempts += 1
        return min(self.cap, delay * (1 + self._rng()))
