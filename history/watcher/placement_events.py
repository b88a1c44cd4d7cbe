"""Kubernetes Events on pipeline pods: why a pod landed where it did.

When the watcher enters a pod into the ledger, it writes an events.k8s.io/v1 Event on
the pod, so `kubectl describe pod` and `kubectl get events` answer "why did my pod
land there?": the node, the warmth the ledger recorded, and the history behind it, in
one line. The reason follows the ledger's warmth (`WarmPlacement` for exact,
`PartialPlacement`, `ColdPlacement`), so a change to how warmth is judged changes the
Events with it. With KSSCHED_WORKSPACE_DEPTH on, an exact placement's line also says
how many other pipelines ran on the node since this one last did (`ledger.Entered`).

Writing is bounded: a token bucket allows `rate` Events per second (bursts up to
`burst`); Events beyond it, or beyond `QUEUE_SIZE` waiting, are dropped and counted.
A thread of its own writes them, so a slow API server never slows the watch. When
the API server refuses with 403 (the RBAC rule is missing), the watcher logs one
line, counts it once and writes no more Events until it restarts. Any other failure
is counted and logged once until an Event is written again. Events are queued after
the ledger's transaction commits and never hold up or undo a placement; on stop, the
queue is written for at most `CLOSE_SECONDS`.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connections

from history import depth_feed, ledger, worth_feed
from history.reader.depths import DEEPEST, counts_as_gone
from history.watcher import metrics
from history.watcher.kube import KubeApi, micro_time

logger = logging.getLogger(__name__)

# The Event's source in `kubectl get events` (reportingController).
CONTROLLER = "ks-scheduler-watcher"
ACTION = "Placed"
REASONS = {
    "exact": "WarmPlacement",
    "partial": "PartialPlacement",
    "cold": "ColdPlacement",
}
# A warmth without a reason of its own (a later kind of warmth) still gets an Event.
OTHER_REASON = "Placement"
# The API server refuses a note longer than this many bytes.
NOTE_MAX_BYTES = 1024
# At most this many keys are named in the note (a label has few segments).
NOTE_MAX_KEYS = 12
# The API server refuses an object name longer than this (a DNS subdomain).
NAME_MAX_LENGTH = 253
# Hex digits of the hash of the pod name that stand for its cut-off tail.
NAME_HASH_DIGITS = 8
# Events waiting to be written beyond this many are dropped (and counted).
QUEUE_SIZE = 100
# On stop, queued Events are written for at most this many seconds.
CLOSE_SECONDS = 5.0


@dataclass(frozen=True)
class PlacementEvent:
    """What one Event says: the pod, its node, the ledger's warmth, the history.

    `history` is (key, count) for the label's keys that had history on the node
    before this pod counted, general to specific.
    """

    namespace: str
    pod: str
    uid: str
    label: str
    node: str
    warmth: str
    keys: tuple[str, ...]
    history: tuple[tuple[str, int], ...]
    # The weight what warmth is worth gives the pipeline's pull, and why
    # (`with_worth`); empty while nothing is learned.
    worth: str = ""
    # With KSSCHED_WORKSPACE_DEPTH on, for an exact placement: how many other
    # pipelines were placed on the node since this one last was (`ledger.Entered`),
    # and the depth `warm` counted a workspace gone from (`with_depth`; 0: none).
    depth: int | None = None
    gone_from: int = 0

    @property
    def reason(self) -> str:
        return REASONS.get(self.warmth, OTHER_REASON)

    @property
    def note(self) -> str:
        """One line: node, warmth, and the history behind it."""
        if self.history:
            counts = ", ".join(
                f"{key} {count}" for key, count in self.history[:NOTE_MAX_KEYS]
            )
            behind = f"pipeline pods before it on {self.node} by key: {counts}"
            missing = [k for k in self.keys if k not in dict(self.history)]
            if missing:
                behind += f"; none for {', '.join(missing[:NOTE_MAX_KEYS])}"
        else:
            behind = f"no history of its keys on {self.node}"
        text = (
            f"Placed on {self.node}: {self.warmth or 'unknown'} "
            f"(pipeline {self.label}); {behind}"
        )
        if self.worth:
            text += f"; {self.worth}"
        if self.depth is not None:
            text += f"; {self.workspace}"
        encoded = text.encode()
        if len(encoded) <= NOTE_MAX_BYTES:
            return text
        return encoded[: NOTE_MAX_BYTES - 3].decode(errors="ignore") + "..."

    @property
    def workspace(self) -> str:
        """What the depth says of the pipeline's workspace on the node."""
        if not self.depth:
            others = "no other pipeline"
        elif self.depth == DEEPEST:
            others = f"{DEEPEST} or more other pipelines"
        else:
            others = f"{self.depth} other pipeline{'s' if self.depth > 1 else ''}"
        text = f"its workspace: {others} placed on {self.node} since it last was"
        if counts_as_gone(self.depth, self.gone_from):
            text += f", so it counts as gone (depth {self.gone_from})"
        return text


def recorded(
    *,
    pod_uid: str,
    namespace: str,
    name: str,
    label: str,
    node: str,
    keys: Sequence[str],
    entered: ledger.Entered,
) -> PlacementEvent:
    """The Event for a placement just entered into the ledger (`ledger.
    enter_placement`): its warmth and the history it was judged from, as the ledger
    stored them, without reading them again."""
    return PlacementEvent(
        namespace=namespace,
        pod=name,
        uid=pod_uid,
        label=label,
        node=node,
        warmth=entered.warmth,
        keys=tuple(dict.fromkeys(keys)),
        history=entered.history,
        depth=entered.depth,
    )


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; `take` never waits."""

    def __init__(
        self,
        *,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"rate must be > 0 and burst >= 1, not {rate}, {burst}")
        self.rate, self.burst = rate, burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True


class PlacementEvents:
    """Writes placement Events from a thread of its own, bounded and quiet on failure.

    `submit` never waits: an Event over the rate, or beyond `queue_size` waiting to
    be written, is dropped and counted. `close` writes what is queued, for at most
    `timeout` seconds, and stops the thread.
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        rate: float,
        burst: int,
        instance: str,
        queue_size: int = QUEUE_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.bucket = TokenBucket(rate=rate, burst=burst, clock=clock)
        self.instance = instance
        self.forbidden = False
        self._failing = False
        self._queue: queue.Queue[PlacementEvent | None] = queue.Queue(queue_size)
        self._thread: threading.Thread | None = None

    def submit(self, event: PlacementEvent) -> None:
        """Queue one Event, or drop it (over the rate, queue full, RBAC missing)."""
        if self.forbidden:
            return
        if not self.bucket.take():
            metrics.PLACEMENT_EVENTS.labels("dropped").inc()
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            metrics.PLACEMENT_EVENTS.labels("dropped").inc()
            return
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._write_queued, name="placement-events", daemon=True
            )
            self._thread.start()

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Write the queued Events (for at most `timeout` seconds), then stop."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)
        self._thread = None

    def _write_queued(self) -> None:
        try:
            while (event := self._queue.get()) is not None:
                try:
                    self.write(with_depth(with_worth(event)))
                except Exception:
                    logger.exception("Cannot write a placement Event")
        finally:
            # The worth refresh reads the ledger from this thread.
            connections.close_all()

    def write(self, event: PlacementEvent) -> str:
        """Write one Event now; returns what happened (the metric's `result`)."""
        if self.forbidden:
            return "off"
        failure = self.api.create_event(
            namespace=event.namespace, body=body(event, self)
        )
        if failure is None:
            self._failing = False
            metrics.PLACEMENT_EVENTS.labels("written").inc()
            return "written"
        if failure.reason == "403":
            self.forbidden = True
            metrics.PLACEMENT_EVENTS.labels("forbidden").inc()
            logger.warning(
                "Cannot write placement Events (403 Forbidden): the watcher's "
                "ServiceAccount needs create on events.k8s.io events; no more are "
                "written until the watcher restarts"
            )
            return "forbidden"
        metrics.PLACEMENT_EVENTS.labels("failed").inc()
        if not self._failing:
            self._failing = True
            logger.warning(
                "Cannot write a placement Event (%s): %.200s; counted in "
                "kssched_placement_events_total until one is written again",
                failure.reason,
                failure.detail,
            )
        return "failed"


def with_worth(event: PlacementEvent) -> PlacementEvent:
    """`event` naming the weight of its pipeline's warm pull, from this process's
    book of what warmth is worth (refreshed here, off the watch loop, at most every
    KSSCHED_WORTH_REFRESH_SECONDS); unchanged while nothing is learned."""
    if settings.KSSCHED_WORTH != "auto":
        return event
    worth = worth_feed.process_worth()
    worth.refresh()
    estimate = worth.estimate(event.label)
    if estimate.credited is None:
        return event
    return replace(
        event, worth=f"warm pull weight {estimate.weight:g}: {estimate.reason}"
    )


def with_depth(event: PlacementEvent) -> PlacementEvent:
    """`event` naming the depth `warm` counts a workspace gone from, as this
    process reads KSSCHED_WORKSPACE_DEPTH (with `auto`, the measurement, refreshed
    here at most every KSSCHED_WORTH_REFRESH_SECONDS); unchanged without a depth."""
    if event.depth is None:
        return event
    feed = depth_feed.process_depth()
    if settings.KSSCHED_WORKSPACE_DEPTH == "auto":
        feed.refresh()
    return replace(event, gone_from=feed.current())


def event_name(pod: str, time_ns: int) -> str:
    """The Event's name: `{pod}.{time_ns:x}`, as client-go names Events, within
    NAME_MAX_LENGTH characters. A pod name too long for that keeps its head, cut
    back to end with a letter or digit (a DNS subdomain has no `-.` or `..`), and a
    hash of the whole name, so two long names that share the head still differ:
    `{head}-{sha256(pod)[:8]}.{time_ns:x}`."""
    suffix = f".{time_ns:x}"
    if len(pod) + len(suffix) <= NAME_MAX_LENGTH:
        return pod + suffix
    digest = hashlib.sha256(pod.encode()).hexdigest()[:NAME_HASH_DIGITS]
    room = NAME_MAX_LENGTH - len(suffix) - len(digest) - 1
    head = pod[:room].rstrip("-.")
    return f"{head}-{digest}{suffix}"


def body(event: PlacementEvent, writer: PlacementEvents) -> dict[str, Any]:
    """The events.k8s.io/v1 Event, named as client-go names Events (`event_name`)."""
    now = datetime.now(UTC)
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": event_name(event.pod, time.time_ns()),
            "namespace": event.namespace,
        },
        "eventTime": micro_time(now),
        "reportingController": CONTROLLER,
        "reportingInstance": writer.instance[:128],
        "action": ACTION,
        "reason": event.reason,
        "type": "Normal",
        "note": event.note,
        "regarding": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": event.namespace,
            "name": event.pod,
            "uid": event.uid,
        },
    }
