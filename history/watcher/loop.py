"""List and watch one resource; a handler says what its objects mean.

A `Stream` runs the loop for one resource:

1. Resume from the handler's saved checkpoint (WatchState); without one, list every
   matching object (server-side selectors) and watch from the list's resourceVersion.
2. Watch with bookmarks, a random server timeout and a client read timeout, so no
   call can block for long. The events already received are written together in
   one database transaction, which also saves the last one's resourceVersion when
   the checkpoint is due: a restart resumes at or before where the committed work
   ends, and a replayed event changes nothing (the handler's writes are
   idempotent). An event with nothing to write opens no transaction.
3. A clean end of stream: watch again at once. 410 Gone (or "too large resource
   version"): list again. Any other fault: exponential backoff with jitter, then
   watch again from the same resourceVersion.

Database errors: a transient one (locked, connection lost) retries the same work
after a backoff, for as long as it takes. A data error (the same statement fails
every time, e.g. a count out of range) is retried a few times; then that one event
is skipped: logged at ERROR, counted, recorded in WatchState, and the watch goes on
(`transactions` sorts the errors).

The handler (`handler.Handler`) is composed in, not inherited from: it gives the
selectors, turns one object into a decision, writes decisions inside the loop's
transaction and returns what happened, and is told each step once it has committed.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from history.exceptions import WatcherFatalError
from history.watcher import kube, metrics, state
from history.watcher.handler import (
    LISTED,
    RECEIVED,
    RELISTING,
    UNREADABLE,
    Handler,
    Step,
)
from history.watcher.health import first_line
from history.watcher.heartbeat import Heartbeat
from history.watcher.options import Backoff, Options
from history.watcher.transactions import (
    DATA_ERROR_ATTEMPTS,
    Unwritable,
    in_transaction,
)

logger = logging.getLogger(__name__)

LIST_BATCH = 200
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
SHORT_WATCH_SECONDS = 1.0
# The longest the checkpoint lags behind events that had nothing to write.
CHECKPOINT_SECONDS = 10.0


class Interrupted(Exception):
    """Shutdown was requested while waiting; the current work is abandoned."""


class _StreamFailure(Exception):
    def __init__(self, failure: kube.Failure, handled: int = 0) -> None:
        super().__init__(failure.detail)
        self.failure = failure
        # Events of the failing batch handled before the ERROR event.
        self.handled = handled


@dataclass
class _Received:
    """One readable watch event, and what the handler decided it means."""

    type_: str
    obj: Any
    metadata: dict[str, Any]
    resource_version: str
    decision: Any = None


def received_together(
    stream: Iterable[Any],
    size: Callable[[], int],
    stop: Callable[[], None],
    linger: float = LINGER_SECONDS,
) -> Iterator[list[Any]]:
    """The stream's events, each time as many as arrive within `linger` seconds
    of the first (at most `size()`): the first is waited for, then the batch takes
    what comes in the next `linger` seconds; the end of the stream or an error ends
    it at once.

    A thread of its own reads the stream into a bounded queue; an error of the
    stream is raised here, after the events before it. Leaving early (shutdown,
    an ERROR event, a database failure) calls `stop`, which ends the stream, and
    the thread with it.
    """
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


class Stream:
    """List and watch one resource, writing through `handler`."""

    def __init__(
        self,
        api: kube.KubeApi,
        handler: Handler,
        *,
        options: Options,
        shutdown: threading.Event | None = None,
        heartbeat: Heartbeat | None = None,
        max_events: int | None = None,
    ) -> None:
        self.api = api
        self.handler = handler
        self.name = handler.name
        self.options = options
        self.shutdown = shutdown or threading.Event()
        self.heartbeat = heartbeat or Heartbeat(None)
        self.max_events = max_events
        self.resource_version = ""
        self.needs_list = True
        self.processed = 0
        self.last_progress = time.monotonic()
        self.backoff = Backoff(
            base=options.backoff_base,
            cap=options.backoff_cap,
            reset=options.backoff_reset,
        )
        self._stream: kube.WatchStream | None = None
        self._lock = threading.Lock()
        # Events handled with nothing to write, not in the checkpoint yet: they are
        # saved with the next write, or after CHECKPOINT_SECONDS (a restart before
        # that replays them, and replaying changes nothing).
        self._unsaved = 0
        self._saved_at = time.monotonic()

    # ---- steps

    def start(self) -> None:
        """Decide where to begin: the saved checkpoint, else a full list."""
        if not self.handler.keeps_checkpoint:
            self.needs_list = True
            return
        self.resource_version = self._transaction(
            lambda: state.checkpoint(name=self.name)
        )
        self.needs_list = not self.resource_version
        if self.resource_version:
            logger.info(
                "Resuming the %s watch from resourceVersion %s",
                self.handler.resource.removesuffix("s"),
                self.resource_version,
            )
        else:
            logger.info("No saved resourceVersion: listing %s first", self.name)

    def relist(self) -> int:
        """List every matching object, write each, save the list's RV; returns N."""
        self.handler.observe(Step(RELISTING))
        selectors = self.handler.selectors
        items, resource_version = self.api.list(
            self.handler.resource,
            namespace=selectors.namespace,
            label_selector=selectors.label_selector,
            field_selector=selectors.field_selector,
            page_size=self.options.page_size,
        )
        logger.info(
            "Listed %d %s at resourceVersion %s",
            len(items),
            self.name,
            resource_version,
        )
        self.heartbeat.beat()
        for start in range(0, len(items), LIST_BATCH):
            self._write_batch(items[start : start + LIST_BATCH])
            self.heartbeat.beat()
        self._transaction(lambda: self._save(resource_version, 0, relisted=True))
        self._unsaved = 0
        self._saved_at = time.monotonic()
        self.last_progress = time.monotonic()
        self.resource_version = resource_version
        self.needs_list = False
        return len(items)

    def handle(self, event: Any) -> None:
        """Handle one raw watch event (`handle_batch` of one)."""
        self.handle_batch([event])

    def handle_batch(self, events: list[Any]) -> None:
        """Handle raw watch events received together, in order; raises
        _StreamFailure for an ERROR event (after writing the events before it).

        The writes of the batch go into one transaction, with the checkpoint when it
        is due: a commit per batch, not per event. A bookmark or an ERROR event
        writes what came before it first. A malformed event (unreadable JSON, no
        object, unknown type) is logged with its context and skipped; so is an
        event that keeps failing with a data error (see `transactions`): the batch
        is then written again one event at a time, so only that event is lost.
        """
        pending: list[_Received] = []
        for index, event in enumerate(events):
            received = self._receive(event)
            if received is None:
                continue
            if received.type_ in ("ERROR", "BOOKMARK"):
                self._write_received(pending)
                pending = []
                if received.type_ == "ERROR":
                    failure = kube.error_event_failure(received.obj)
                    raise _StreamFailure(failure, handled=index)
                self._bookmark(received.resource_version)
                continue
            received.decision = self.handler.decide(received.type_, received.obj)
            if received.decision is None and not pending:
                self._nothing_to_write(received)
            else:
                # Behind a write of this batch: its checkpoint waits for that write.
                pending.append(received)
        self._write_received(pending)

    def _receive(self, event: Any) -> _Received | None:
        """One raw event read; None (logged, observed) when it is skipped."""
        self.heartbeat.beat()
        self.handler.observe(Step(RECEIVED))
        if not isinstance(event, dict):
            logger.warning("Skipping unreadable %s watch event: %r", self.name, event)
            self.handler.observe(Step(UNREADABLE))
            return None
        type_ = event.get("type")
        obj = event.get("object")
        if type_ == "ERROR":
            return _Received("ERROR", obj, {}, "")
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        resource_version = str((metadata or {}).get("resourceVersion") or "")
        if type_ == "BOOKMARK":
            return _Received("BOOKMARK", obj, {}, resource_version)
        if (
            type_ not in ("ADDED", "MODIFIED", "DELETED")
            or not isinstance(metadata, dict)
            or not isinstance(obj, dict)
        ):
            logger.warning(
                "Skipping unexpected %s watch event (type %r, object %.300r)",
                self.name,
                type_,
                obj,
            )
            kind = str(type_) if type_ in ("ADDED", "MODIFIED") else UNREADABLE
            self.handler.observe(Step(kind))
            return None
        logger.debug(
            "%s %s %s/%s rv=%s",
            type_,
            self.handler.resource,
            metadata.get("namespace", ""),
            metadata.get("name"),
            resource_version,
        )
        return _Received(type_, obj, metadata, resource_version)

    def _bookmark(self, resource_version: str) -> None:
        if resource_version:
            if self.handler.keeps_checkpoint:
                self._transaction(lambda: self._save(resource_version, 0))
            self.resource_version = resource_version
            self.last_progress = time.monotonic()
        self.handler.observe(Step("BOOKMARK"))

    def _nothing_to_write(self, received: _Received) -> None:
        """An event with nothing to write: only move on (the checkpoint follows in
        a while)."""
        if received.resource_version:
            self.resource_version = received.resource_version
        if self.handler.keeps_checkpoint:
            self._unsaved += 1
            if time.monotonic() - self._saved_at >= CHECKPOINT_SECONDS:
                self.save_progress()
            self.handler.observe(Step(received.type_, 1, []))
            self._count_processed(1)

    def _write_received(self, pending: list[_Received]) -> None:
        """Write the decisions of `pending` events in one transaction."""
        if not pending:
            return
        decisions = [r.decision for r in pending if r.decision is not None]
        resource_version = next(
            (r.resource_version for r in reversed(pending) if r.resource_version), ""
        )
        # The checkpoint moves in the transaction of a write, never ahead of it, at
        # most every CHECKPOINT_SECONDS: a restart replays the rest, and replaying
        # a write changes nothing (one ledger row per pod).
        unsaved = self._unsaved + len(pending)
        save = time.monotonic() - self._saved_at >= CHECKPOINT_SECONDS

        def work() -> list[Any]:
            outcomes = self.handler.write(decisions)
            if save:
                self._save(resource_version, unsaved)
            return outcomes

        try:
            outcomes = self._transaction(work, bounded=True)
        except Unwritable as exc:
            if len(pending) > 1:
                for received in pending:
                    if received.decision is None:
                        self._nothing_to_write(received)
                    else:
                        self._write_received([received])
                return
            only = pending[0]
            self._skip(only.type_, only.metadata, only.resource_version, exc.error)
        else:
            if save:
                self._unsaved -= unsaved - len(pending)
                self._saved_at = time.monotonic()
            else:
                self._unsaved += len(pending)
            written = iter(outcomes)
            for received in pending:
                if received.decision is not None:
                    self.handler.observe(Step(received.type_, 1, [next(written)]))
                elif self.handler.keeps_checkpoint:
                    self.handler.observe(Step(received.type_, 1, []))
        self.last_progress = time.monotonic()
        if resource_version:
            self.resource_version = resource_version
        counted = [r for r in pending if r.decision is not None]
        self._count_processed(
            len(pending) if self.handler.keeps_checkpoint else len(counted)
        )

    def save_progress(self) -> None:
        """Save the checkpoint of the events handled with nothing to write."""
        if not self._unsaved or not self.resource_version:
            return
        unsaved, resource_version = self._unsaved, self.resource_version
        try:
            self._transaction(
                lambda: self._save(resource_version, unsaved), bounded=True
            )
        except (Unwritable, Interrupted):
            return  # saved with a later write; replaying the events changes nothing
        self._unsaved -= unsaved
        self._saved_at = time.monotonic()

    def watch_once(self, server_timeout: int | None = None) -> bool:
        """List if needed, then run one watch request to its end.

        `server_timeout` (seconds) overrides the random server timeout: a short one
        takes only the events the API server has already queued.

        Returns True when the next watch may start at once, False when the caller
        should back off first (a fault, or a watch that ended at once with nothing).
        """
        self.heartbeat.beat()
        delivered = 0
        started = time.monotonic()
        try:
            if self.needs_list:
                self.relist()
                if self.shutdown.is_set():
                    return True
            selectors = self.handler.selectors
            stream = self.api.watch(
                self.handler.resource,
                resource_version=self.resource_version,
                namespace=selectors.namespace,
                label_selector=selectors.label_selector,
                field_selector=selectors.field_selector,
                server_timeout=server_timeout
                or random.randint(*self.options.server_timeout),
            )
            with self._lock:
                self._stream = stream
            if self.shutdown.is_set():
                return True
            logger.info(
                "Watching %s from resourceVersion %s", self.name, self.resource_version
            )
            for events in received_together(stream, self._batch_size, stream.stop):
                self.handle_batch(events)
                delivered += len(events)
                if self.shutdown.is_set():
                    return True
        except Interrupted:
            return True
        except _StreamFailure as exc:
            return self._failed(exc.failure, delivered + exc.handled)
        except (WatcherFatalError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - sorted below, unknown ones logged
            if self.shutdown.is_set():
                return True
            failure = kube.classify(exc)
            if failure is None:
                logger.warning(
                    "The %s stream broke on an unreadable response: %r", self.name, exc
                )
                failure = kube.Failure(kube.RETRY, "malformed", repr(exc))
            return self._failed(failure, delivered)
        finally:
            with self._lock:
                self._stream = None
            if not self.needs_list:
                self.save_progress()
        short = time.monotonic() - started < SHORT_WATCH_SECONDS
        if delivered == 0 and short and server_timeout is None:
            metrics.RECONNECTS.labels("short_watch").inc()
            logger.warning("The %s watch ended at once with no events", self.name)
            return False
        logger.debug("The %s watch ended; watching again", self.name)
        return True

    def interrupt(self) -> None:
        """Unblock a running watch (signal handlers and other threads may call)."""
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.stop()

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Watch until shutdown (or `until()` is true), backing off after faults."""
        until = until or (lambda: False)
        while not self.shutdown.is_set() and not until():
            if self.watch_once():
                continue
            delay = self.backoff.next_delay()
            # The fault itself was logged once, at WARNING (one line per attempt).
            logger.debug(
                "Backing off %.1f s before watching %s again", delay, self.name
            )
            try:
                self.sleep(delay)
            except Interrupted:
                return

    def sleep(self, seconds: float) -> None:
        """Wait, touching the heartbeat every second; Interrupted on shutdown."""
        deadline = time.monotonic() + seconds
        while True:
            self.heartbeat.beat()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.shutdown.wait(min(1.0, left)):
                raise Interrupted

    # ---- writing

    def _write_batch(self, objects: list[dict[str, Any]]) -> None:
        """Write listed objects in one transaction; one by one if that cannot be."""
        decisions = [self.handler.decide(LISTED, obj) for obj in objects]
        try:
            outcomes = self._transaction(
                lambda: self.handler.write([d for d in decisions if d is not None]),
                bounded=True,
            )
        except Unwritable as exc:
            if len(objects) > 1:
                for obj in objects:
                    self._write_batch([obj])
                return
            self._skip(LISTED, objects[0].get("metadata") or {}, "", exc.error)
        else:
            self.handler.observe(Step(LISTED, len(objects), outcomes))
        self._count_processed(len(objects))

    def _save(
        self,
        resource_version: str,
        events: int,
        relisted: bool = False,
        skipped: str = "",
    ) -> None:
        """Save progress (inside the caller's transaction).

        Streams without a checkpoint keep only the health fields, and only for a
        relist or a skipped event.
        """
        if self.handler.keeps_checkpoint:
            state.save_watch_state(
                name=self.name,
                resource_version=resource_version,
                events=events,
                relisted=relisted,
                skipped=skipped,
            )
        elif relisted or skipped:
            state.save_watch_state(
                name=self.name,
                resource_version=resource_version if relisted else None,
                relisted=relisted,
                skipped=skipped,
            )

    def _skip(
        self,
        type_: str,
        metadata: dict[str, Any],
        resource_version: str,
        error: DatabaseError,
    ) -> None:
        """Give up on one event that cannot be written; the watch goes on."""
        what = (
            f"{type_} {self.handler.resource} "
            f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''} "
            f"uid={metadata.get('uid') or '-'} "
            f"rv={resource_version or metadata.get('resourceVersion') or '-'}: "
            f"{type(error).__name__}: {first_line(error)}"
        )
        logger.error(
            "Skipping a %s event that cannot be written after %d attempts: %s",
            self.name,
            DATA_ERROR_ATTEMPTS,
            what,
        )
        metrics.EVENTS_SKIPPED.labels(self.name).inc()
        events = 0 if type_ == LISTED else 1
        self._transaction(lambda: self._save(resource_version, events, skipped=what))
        self.handler.observe(Step(type_))

    def _transaction(self, work: Callable[[], Any], *, bounded: bool = False) -> Any:
        """`work` in one transaction, retried as `transactions` says; its result."""
        return in_transaction(
            work,
            stream=self.name,
            sleep=self.sleep,
            base=self.options.backoff_base,
            cap=self.options.backoff_cap,
            bounded=bounded,
        )

    # ---- internals

    def _batch_size(self) -> int:
        """The most events one batch may take (never past `max_events`)."""
        if self.max_events is None:
            return WATCH_BATCH
        return max(1, min(WATCH_BATCH, self.max_events - self.processed))

    def _count_processed(self, number: int) -> None:
        self.processed += number
        if self.max_events is not None and self.processed >= self.max_events:
            logger.info(
                "Handled %d %s events and list items: stopping as asked",
                self.processed,
                self.name,
            )
            self.shutdown.set()

    def _failed(self, failure: kube.Failure, delivered: int) -> bool:
        metrics.RECONNECTS.labels(failure.reason).inc()
        if failure.action == kube.GONE:
            logger.warning(
                "Relisting %s because resourceVersion %s (last progress %.0f s ago) "
                "expired (%s: %s)",
                self.name,
                self.resource_version,
                time.monotonic() - self.last_progress,
                failure.reason,
                failure.detail[:200],
            )
            self.needs_list = True
            # Relist at once after a stream that made progress; otherwise back off,
            # so a server that keeps answering 410 cannot cause a tight loop.
            return delivered > 0
        log = logger.error if failure.reason in ("401", "403") else logger.warning
        log(
            "The %s watch failed (%s): %s; %s",
            self.name,
            failure.reason,
            failure.detail[:300],
            "listing again"
            if self.needs_list
            else f"watching again from {self.resource_version}",
        )
        return False
