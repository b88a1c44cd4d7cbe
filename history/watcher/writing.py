"""How one stream's steps are written (`loop.Stream` decides when to list and
watch; a `Writer` writes what that brings).

The events of a batch go into one transaction, with the checkpoint when it is
due: the checkpoint moves in the transaction of a write, never ahead of it, at most
every CHECKPOINT_SECONDS, and events with nothing to write open no transaction
(their checkpoint follows with the next write, or after CHECKPOINT_SECONDS). A
restart replays the rest, and replaying changes nothing: the handler's writes are
idempotent (one ledger row per pod). A batch that keeps failing with a data error
is written again one event at a time, so only the event that cannot be written is
skipped: logged at ERROR, counted, and recorded in WatchState.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError

from history.watcher import metrics, state
from history.watcher.arrivals import Received
from history.watcher.handler import LISTED, Handler, Step
from history.watcher.health import first_line
from history.watcher.options import Options
from history.watcher.transactions import (
    DATA_ERROR_ATTEMPTS,
    Unwritable,
    in_transaction,
)

logger = logging.getLogger(__name__)

# The longest the checkpoint lags behind events that had nothing to write.
CHECKPOINT_SECONDS = 10.0


class Interrupted(Exception):
    """Shutdown was requested while waiting; the current work is abandoned."""


class Writer:
    """Writes one stream's steps through its handler and keeps its checkpoint.

    `sleep` waits between attempts (raising Interrupted on shutdown); `count` is
    told how many events and list items each step handled.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        options: Options,
        sleep: Callable[[float], None],
        count: Callable[[int], None],
    ) -> None:
        self.handler = handler
        self.name = handler.name
        self.options = options
        self.sleep = sleep
        self.count = count
        # Where the stream is: the last resourceVersion handled, and when.
        self.resource_version = ""
        self.last_progress = time.monotonic()
        # Events handled with nothing to write, not in the checkpoint yet.
        self.unsaved = 0
        self.saved_at = time.monotonic()

    def listed(self, objects: list[dict[str, Any]]) -> None:
        """Write listed objects in one transaction; one by one if that cannot be."""
        decisions = [self.handler.decide(LISTED, obj) for obj in objects]
        try:
            outcomes = self.transaction(
                lambda: self.handler.write([d for d in decisions if d is not None]),
                bounded=True,
            )
        except Unwritable as exc:
            if len(objects) > 1:
                for obj in objects:
                    self.listed([obj])
                return
            self.skip(LISTED, objects[0].get("metadata") or {}, "", exc.error)
        else:
            self.handler.observe(Step(LISTED, len(objects), outcomes))
        self.count(len(objects))

    def relisted(self, resource_version: str) -> None:
        """The list at `resource_version` is written: save it as the checkpoint."""
        self.transaction(lambda: self.save(resource_version, 0, relisted=True))
        self.unsaved = 0
        self.saved_at = self.last_progress = time.monotonic()
        self.resource_version = resource_version

    def bookmark(self, resource_version: str) -> None:
        if resource_version:
            if self.handler.keeps_checkpoint:
                self.transaction(lambda: self.save(resource_version, 0))
            self.resource_version = resource_version
            self.last_progress = time.monotonic()
        self.handler.observe(Step("BOOKMARK"))

    def nothing_to_write(self, received: Received) -> None:
        """An event with nothing to write: only move on (the checkpoint follows in
        a while)."""
        if received.resource_version:
            self.resource_version = received.resource_version
        if self.handler.keeps_checkpoint:
            self.unsaved += 1
            if time.monotonic() - self.saved_at >= CHECKPOINT_SECONDS:
                self.save_progress()
            self.handler.observe(Step(received.type_, 1, []))
            self.count(1)

    def received(self, pending: list[Received]) -> None:
        """Write the decisions of `pending` events in one transaction."""
        if not pending:
            return
        decisions = [r.decision for r in pending if r.decision is not None]
        resource_version = next(
            (r.resource_version for r in reversed(pending) if r.resource_version), ""
        )
        unsaved = self.unsaved + len(pending)
        save = time.monotonic() - self.saved_at >= CHECKPOINT_SECONDS

        def work() -> list[Any]:
            outcomes = self.handler.write(decisions)
            if save:
                self.save(resource_version, unsaved)
            return outcomes

        try:
            outcomes = self.transaction(work, bounded=True)
        except Unwritable as exc:
            if len(pending) > 1:
                for received in pending:
                    if received.decision is None:
                        self.nothing_to_write(received)
                    else:
                        self.received([received])
                return
            only = pending[0]
            self.skip(only.type_, only.metadata, only.resource_version, exc.error)
        else:
            if save:
                self.unsaved -= unsaved - len(pending)
                self.saved_at = time.monotonic()
            else:
                self.unsaved += len(pending)
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
        self.count(len(pending) if self.handler.keeps_checkpoint else len(counted))

    def save_progress(self) -> None:
        """Save the checkpoint of the events handled with nothing to write."""
        if not self.unsaved or not self.resource_version:
            return
        unsaved, resource_version = self.unsaved, self.resource_version
        try:
            self.transaction(lambda: self.save(resource_version, unsaved), bounded=True)
        except (Unwritable, Interrupted):
            return  # saved with a later write; replaying the events changes nothing
        self.unsaved -= unsaved
        self.saved_at = time.monotonic()

    def save(
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

    def skip(
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
        self.transaction(lambda: self.save(resource_version, events, skipped=what))
        self.handler.observe(Step(type_))

    def transaction(self, work: Callable[[], Any], *, bounded: bool = False) -> Any:
        """`work` in one transaction, retried as `transactions` says; its result."""
        return in_transaction(
            work,
            stream=self.name,
            sleep=self.sleep,
            base=self.options.backoff_base,
            cap=self.options.backoff_cap,
            bounded=bounded,
        )
