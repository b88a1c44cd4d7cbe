"""List and watch one resource; a handler says what its objects mean.

A `Stream` runs the loop for one resource:

1. Resume from the handler's saved checkpoint (WatchState); without one, list every
   matching object (server-side selectors) and watch from the list's resourceVersion.
2. Watch with bookmarks, a random server timeout and a client read timeout, so no
   call can block for long. The events already received are written together in
   one database transaction, which also saves the last one's resourceVersion when
   the checkpoint is due: a restart resumes at or before where the committed work
   ends, and a replayed event changes nothing (the handler's writes are
   idempotent). An event with nothing to write opens no transaction. How events
   arrive in batches: `arrivals`; how a batch is written: `writing.Writer`.
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
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from history.exceptions import WatcherFatalError
from history.watcher import kube, metrics, state
from history.watcher.arrivals import (
    WATCH_BATCH,
    Received,
    read_event,
    received_together,
)
from history.watcher.handler import (
    RECEIVED,
    RELISTING,
    Handler,
    Step,
)
from history.watcher.heartbeat import Heartbeat
from history.watcher.options import Backoff, Options
from history.watcher.writing import Interrupted, Writer

logger = logging.getLogger(__name__)

LIST_BATCH = 200
SHORT_WATCH_SECONDS = 1.0


class _StreamFailure(Exception):
    def __init__(self, failure: kube.Failure, handled: int = 0) -> None:
        super().__init__(failure.detail)
        self.failure = failure
        # Events of the failing batch handled before the ERROR event.
        self.handled = handled


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
        self.needs_list = True
        self.processed = 0
        self.writer = Writer(
            handler, options=options, sleep=self.sleep, count=self._count_processed
        )
        self.backoff = Backoff(
            base=options.backoff_base,
            cap=options.backoff_cap,
            reset=options.backoff_reset,
        )
        self._stream: kube.WatchStream | None = None
        self._lock = threading.Lock()

    @property
    def resource_version(self) -> str:
        """Where the next watch resumes: the last resourceVersion handled."""
        return self.writer.resource_version

    @resource_version.setter
    def resource_version(self, value: str) -> None:
        self.writer.resource_version = value

    # ---- steps

    def start(self) -> None:
        """Decide where to begin: the saved checkpoint, else a full list."""
        if not self.handler.keeps_checkpoint:
            self.needs_list = True
            return
        self.resource_version = self.writer.transaction(
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
            self.writer.listed(items[start : start + LIST_BATCH])
            self.heartbeat.beat()
        self.writer.relisted(resource_version)
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
        pending: list[Received] = []
        for index, event in enumerate(events):
            received = self._receive(event)
            if received is None:
                continue
            if received.type_ in ("ERROR", "BOOKMARK"):
                self.writer.received(pending)
                pending = []
                if received.type_ == "ERROR":
                    failure = kube.error_event_failure(received.obj)
                    raise _StreamFailure(failure, handled=index)
                self.writer.bookmark(received.resource_version)
                continue
            received.decision = self.handler.decide(received.type_, received.obj)
            if received.decision is None and not pending:
                self.writer.nothing_to_write(received)
            else:
                # Behind a write of this batch: its checkpoint waits for that write.
                pending.append(received)
        self.writer.received(pending)

    def _receive(self, event: Any) -> Received | None:
        """One raw event read; None (logged, observed) when it is skipped."""
        self.heartbeat.beat()
        self.handler.observe(Step(RECEIVED))
        received = read_event(event, name=self.name, resource=self.handler.resource)
        if isinstance(received, str):
            self.handler.observe(Step(received))
            return None
        return received

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
            for events in received_together(
                stream, self._batch_size, stream.stop, urgent=self.handler.urgent
            ):
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
                self.writer.save_progress()
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
                time.monotonic() - self.writer.last_progress,
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
