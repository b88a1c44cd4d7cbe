"""The watcher's health as its readers see it: the admin's status panel, /metrics,
/readyz and `manage.py watcher_health` all read the WatchState rows through here.

Kept free of heavy imports (the models only), so `watcher_health` starts fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from history.models import WatchState


@dataclass(frozen=True, slots=True)
class StreamHealth:
    """One watch stream's progress (pods, nodes), as the watcher last saved it."""

    name: str
    events: int
    relists: int
    skipped_events: int
    last_skipped: str
    last_skipped_at: datetime | None
    last_event_at: datetime | None
    heartbeat_at: datetime | None
    resource_version: str
    holder: str

    @property
    def last_progress_at(self) -> datetime | None:
        """When the watcher last committed an event or a heartbeat for the stream."""
        return max(
            (t for t in (self.last_event_at, self.heartbeat_at) if t), default=None
        )


def stream_health() -> list[StreamHealth]:
    """Every stream the watcher reported, by name (one query)."""
    return [
        StreamHealth(
            name=state.name,
            events=state.events,
            relists=state.relists,
            skipped_events=state.skipped_events,
            last_skipped=state.last_skipped,
            last_skipped_at=state.last_skipped_at,
            last_event_at=state.last_event_at,
            heartbeat_at=state.heartbeat_at,
            resource_version=state.resource_version,
            holder=state.holder,
        )
        for state in WatchState.objects.order_by("name")
    ]


def has_reported() -> bool:
    """True once a watcher saved progress for any stream."""
    return WatchState.objects.exists()


def with_skipped_events(streams: list[StreamHealth]) -> list[StreamHealth]:
    """The streams that skipped events they could not write."""
    return [stream for stream in streams if stream.skipped_events > 0]


def seconds_since(moment: datetime | None, now: datetime) -> float | None:
    """Seconds from `moment` to `now`, or None when there is no moment."""
    return None if moment is None else (now - moment).total_seconds()


def first_line(error: BaseException) -> str:
    """The first line of an error's text (PostgreSQL adds DETAIL lines, and the
    first one holds no credentials), or the error's type when it has no text."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
