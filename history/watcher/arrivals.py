"""What arrives on a watch: raw events, taken in batches as they come
(`received_together`), and each one read into a `Received` (`read_event`).

Kept apart from the loop (`loop.Stream`), which decides when to watch and how the
batches are written.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from history.watcher.handler import UNREADABLE

logger = logging.getLogger(__name__)

# Watch events already received are written together, at most this many at once.
WATCH_BATCH = 200
# Watch events read ahead of the writes, at most (the reader thread then waits).
READ_AHEAD = 1000
QUEUE_POLL_SECONDS = 0.5
# After the first event of a batch, how long the writer waits for more before it
# writes: on a real API server a pod's events come one at a time, a few ms apart,
# and a transaction each is most of what the watcher costs (see docs/design.md).
LINGER_SECONDS = 0.05
_EVENT, _FAILED, _END = "event", "failed", "end"


@dataclass
class Received:
    """One readable watch event, and what the handler decided it means."""

    type_: str
    obj: Any
    metadata: dict[str, Any]
    resource_version: str
    decision: Any = None


def read_event(event: Any, *, name: str, resource: str) -> Received | str:
    """One raw event of stream `name` read; when it must be skipped (logged here),
    the kind of step to observe instead: UNREADABLE, or the type it claimed."""
    if not isinstance(event, dict):
        logger.warning("Skipping unreadable %s watch event: %r", name, event)
        return UNREADABLE
    type_ = event.get("type")
    obj = event.get("object")
    if type_ == "ERROR":
        return Received("ERROR", obj, {}, "")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    resource_version = str((metadata or {}).get("resourceVersion") or "")
    if type_ == "BOOKMARK":
        return Received("BOOKMARK", obj, {}, resource_version)
    if (
        type_ not in ("ADDED", "MODIFIED", "DELETED")
        or not isinstance(metadata, dict)
        or not isinstance(obj, dict)
    ):
        logger.warning(
            "Skipping unexpected %s watch event (type %r, object %.300r)",
            name,
            type_,
            obj,
        )
        return str(type_) if type_ in ("ADDED", "MODIFIED") else UNREADABLE
    logger.debug(
        "%s %s %s/%s rv=%s",
        type_,
        resource,
        metadata.get("namespace", ""),
        metadata.get("name"),
        resource_version,
    )
    return Received(type_, obj, metadata, resource_version)


def received_together(
    stream: Iterable[Any],
    size: Callable[[], int],
    stop: Callable[[], None],
    linger: float | None = None,
    urgent: Callable[[Any], bool] = lambda event: False,
) -> Iterator[list[Any]]:
    """The stream's events, each time as many as arrive within `linger` seconds
    of the first (at most `size()`; LINGER_SECONDS, read at each call, unless
    given): the first is waited for, then the batch takes what comes in the next
    `linger` seconds; the end of the stream or an error ends it at once. An
    `urgent` event ends the wait: the batch then takes only what has already
    arrived (a new placement must be in the ledger before kube-scheduler scores the
    next pod, which counts the pods bound on each node).

    A thread of its own reads the stream into a bounded queue; an error of the
    stream is raised here, after the events before it. Leaving early (shutdown,
    an ERROR event, a database failure) calls `stop`, which ends the stream, and
    the thread with it.
    """
    if linger is None:
        linger = LINGER_SECONDS
    arrived: queue.Queue[tuple[str, Any]] = queue.Queue(READ_AHEAD)
    done = threading.Event()

    def put(item: tuple[str, Any]) -> bool:
        while not done.is_set():
            try:
                arrived.put(item, timeout=QUEUE_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for event in stream:
                if not put((_EVENT, event)):
                    return
        except BaseException as exc:  # noqa: BLE001 - raised again by the reader
            put((_FAILED, exc))
        else:
            put((_END, None))

    thread = threading.Thread(target=read, name="watch-reader", daemon=True)
    thread.start()
    ended = False
    try:
        while True:
            kind, item = arrived.get()
            events: list[Any] = []
            limit = size()
            deadline = time.monotonic() + linger
            while kind == _EVENT:
                events.append(item)
                if len(events) >= limit:
                    break
                if urgent(item):
                    deadline = 0.0
                try:
                    kind, item = arrived.get(
                        timeout=max(0.0, deadline - time.monotonic())
                    )
                except queue.Empty:
                    break
            if events:
                yield events
            if kind == _FAILED:
                ended = True
                raise item
            if kind == _END:
                ended = True
                return
    finally:
        done.set()
        if not ended:
            stop()
