"""Turn the pod watch into placements, exactly once per pod UID.

The loop, for the pod stream (`PodStream`):

1. Resume from the resourceVersion saved in WatchState('pods'); without one, list
   every pipeline pod (server-side field and label selectors) and watch from the
   list's resourceVersion.
2. Watch with bookmarks, a random server timeout and a client read timeout, so no
   call can block for long. Each event is handled in one database transaction that
   also saves its resourceVersion: a restart resumes exactly where the committed
   work ends, and a replayed event changes nothing (the ledger is keyed on the UID).
3. A clean end of stream: watch again at once. 410 Gone (or "too large resource
   version"): list again. Any other fault: exponential backoff with jitter, then
   watch again from the same resourceVersion. A database error retries the same
   event after a backoff; events are never skipped.

`NodeStream` runs the same list/watch machinery over Nodes (in memory only, it
relists at every start) and records each node's UID, so a replaced node is noticed.

Every step is a method that can be called on its own (`relist`, `process_event`,
`watch_once`); the command `watch_pods` only wires them to signals and options.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    ProgrammingError,
    close_old_connections,
    connection,
    transaction,
)
from django.utils import timezone

from history import kube, labels, ledger, metrics
from history.heartbeat import Heartbeat
from history.watcher import state

logger = logging.getLogger(__name__)

PODS = "pods"
NODES = "nodes"
LIST_BATCH = 200
SHORT_WATCH_SECONDS = 1.0


class FatalError(Exception):
    """A fault the watcher cannot recover from by retrying (schema missing...)."""


class Interrupted(Exception):
    """Shutdown was requested while waiting; the current work is abandoned."""


class _StreamFailure(Exception):
    def __init__(self, failure: kube.Failure) -> None:
        super().__init__(failure.detail)
        self.failure = failure


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
        delay = min(self.cap, self.base * 2**self.attempts)
        self.attempts += 1
        return min(self.cap, delay * (1 + self._rng()))


class StreamWatcher:
    """List and watch one resource; subclasses say what an object means."""

    name = ""
    resource = ""

    def __init__(
        self,
        api: kube.KubeApi,
        *,
        options: Options,
        shutdown: threading.Event | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.api = api
        self.options = options
        self.shutdown = shutdown or threading.Event()
        self.heartbeat = heartbeat or Heartbeat(None)
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

    # ---- selectors

    @property
    def label_selector(self) -> str:
        return ""

    @property
    def field_selector(self) -> str:
        return ""

    @property
    def namespace(self) -> str | None:
        return None

    # ---- steps

    def start(self) -> None:
        """Decide where to begin: the saved checkpoint, else a full list."""
        self.needs_list = True

    def relist(self) -> int:
        """List every matching object, apply each, save the list's RV; returns N."""
        items, resource_version = self.api.list(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
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
            batch = items[start : start + LIST_BATCH]
            self._write(lambda batch=batch: [self.apply("LISTED", o) for o in batch])
            self._count_processed(len(batch))
            self.heartbeat.beat()
        self._write(lambda: self.save_progress(resource_version, 0, relisted=True))
        self._after_relist()
        self.last_progress = time.monotonic()
        self.resource_version = resource_version
        self.needs_list = False
        return len(items)

    def process_event(self, event: Any) -> None:
        """Handle one raw watch event; raises _StreamFailure for ERROR events.

        A malformed event (unreadable JSON, no object, unknown type) is logged with
        its context and skipped. Database errors are retried, never skipped.
        """
        self.heartbeat.beat()
        if not isinstance(event, dict):
            logger.warning("Skipping unreadable %s watch event: %r", self.name, event)
            self._on_event("INVALID")
            return
        type_ = event.get("type")
        obj = event.get("object")
        if type_ == "ERROR":
            raise _StreamFailure(kube.error_event_failure(obj))
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        resource_version = str((metadata or {}).get("resourceVersion") or "")
        if type_ == "BOOKMARK":
            if resource_version:
                self._write(lambda: self.save_progress(resource_version, 0))
                self.resource_version = resource_version
                self.last_progress = time.monotonic()
            self._on_event("BOOKMARK")
            return
        if type_ not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(
            metadata, dict
        ):
            logger.warning(
                "Skipping unexpected %s watch event (type %r, object %.300r)",
                self.name,
                type_,
                obj,
            )
            self._on_event(str(type_) if type_ in ("ADDED", "MODIFIED") else "INVALID")
            return
        logger.debug(
            "%s %s %s/%s rv=%s",
            type_,
            self.resource,
            metadata.get("namespace", ""),
            metadata.get("name"),
            resource_version,
        )

        def work() -> None:
            self.apply(type_, obj)
            self.save_progress(resource_version, 1)

        self._write(work)
        self.last_progress = time.monotonic()
        if resource_version:
            self.resource_version = resource_version
        self._on_event(type_)
        self._count_processed(1)

    def watch_once(self) -> bool:
        """List if needed, then run one watch request to its end.

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
            timeout = random.randint(*self.options.server_timeout)
            stream = self.api.watch(
                self.resource,
                resource_version=self.resource_version,
                namespace=self.namespace,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                server_timeout=timeout,
            )
            with self._lock:
                self._stream = stream
            if self.shutdown.is_set():
                return True
            logger.info(
                "Watching %s from resourceVersion %s", self.name, self.resource_version
            )
            for event in stream:
                self.process_event(event)
                delivered += 1
                if self.shutdown.is_set():
                    return True
        except Interrupted:
            return True
        except _StreamFailure as exc:
            return self._failed(exc.failure, delivered)
        except (FatalError, KeyboardInterrupt):
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
        if delivered == 0 and time.monotonic() - started < SHORT_WATCH_SECONDS:
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
            logger.info("Backing off %.1f s before watching %s again", delay, self.name)
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

    # ---- hooks

    def apply(self, type_: str, obj: dict[str, Any]) -> None:
        """Apply one object (inside the caller's transaction)."""
        raise NotImplementedError

    def save_progress(self, resource_version: str, events: int, relisted=False):
        """Persist progress (inside the caller's transaction)."""

    def _after_relist(self) -> None:
        pass

    def _on_event(self, type_: str) -> None:
        pass

    def _count_processed(self, number: int) -> None:
        self.processed += number

    # ---- internals

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
            "The %s watch failed (%s): %s; watching again from %s",
            self.name,
            failure.reason,
            failure.detail[:300],
            self.resource_version,
        )
        return False

    def _write(self, work: Callable[[], Any]) -> Any:
        """Run `work` in one transaction; retry it after database errors."""
        delay = self.options.backoff_base
        while True:
            close_old_connections()
            try:
                with transaction.atomic():
                    return work()
            except (ProgrammingError, FatalError) as exc:
                raise FatalError(f"database schema problem: {exc}") from exc
            except (DatabaseError, InterfaceError) as exc:
                if "no such table" in str(exc):
                    raise FatalError(f"database schema problem: {exc}") from exc
                metrics.DB_RETRIES.inc()
                logger.warning(
                    "Database error on %s (%s); retrying in %.1f s",
                    self.name,
                    exc,
                    delay,
                )
                connection.close()
                self.sleep(delay)
                delay = min(self.options.backoff_cap, delay * 2)


class PodStream(StreamWatcher):
    """Pipeline pods: each bound pod UID becomes one placement."""

    name = PODS
    resource = "pods"

    @property
    def label_selector(self) -> str:
        return self.options.pipeline_label

    @property
    def field_selector(self) -> str:
        if self.options.any_scheduler:
            return ""
        return f"spec.schedulerName={self.options.scheduler_name}"

    @property
    def namespace(self) -> str | None:
        return self.options.namespace

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._outcomes: list[str] = []

    def start(self) -> None:
        self.resource_version = self._write(lambda: state.checkpoint(name=PODS))
        self.needs_list = not self.resource_version
        if self.resource_version:
            logger.info("Resuming the pod watch from resourceVersion %s", self.rv_text)
        else:
            logger.info("No saved resourceVersion: listing pods first")

    @property
    def rv_text(self) -> str:
        return self.resource_version or "-"

    def apply(self, type_: str, obj: dict[str, Any]) -> str:
        """Record or finish the placement of one pod state; returns what it did."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        uid = meta.get("uid")
        if not uid or not isinstance(spec, dict) or not isinstance(status, dict):
            logger.warning("Skipping pod without uid or spec: %.300r", obj)
            return "invalid"
        if (
            not self.options.any_scheduler
            and spec.get("schedulerName") != self.options.scheduler_name
        ):
            return "ignored"
        label = (meta.get("labels") or {}).get(self.options.pipeline_label)
        node = spec.get("nodeName")
        phase = status.get("phase")
        outcome = "ignored"
        if label and node and labels.split_pipeline_label(label):
            if self.options.count_when == "bound" or phase in ("Running", "Succeeded"):
                created = ledger.record_placement(
                    pod_uid=uid,
                    namespace=meta.get("namespace", ""),
                    name=meta.get("name", ""),
                    label=label,
                    node=node,
                    bound_at=_scheduled_at(status),
                    resource_version=str(meta.get("resourceVersion") or ""),
                )
                outcome = "recorded" if created else "duplicate"
        # A DELETED event without the label means the label was removed: the pod
        # still runs. With the label it is a real deletion.
        ended = phase in ("Succeeded", "Failed") or (type_ == "DELETED" and label)
        if ended and node:
            ledger.finish_placement(pod_uid=uid)
        self._outcomes.append(outcome)
        return outcome

    def save_progress(self, resource_version: str, events: int, relisted=False):
        state.save_watch_state(
            name=PODS,
            resource_version=resource_version,
            events=events,
            relisted=relisted,
        )

    def process_event(self, event: Any) -> None:
        metrics.mark_event()
        super().process_event(event)

    def relist(self) -> int:
        metrics.RELISTS.inc()
        listed = super().relist()
        metrics.WATCH_EVENTS.labels("LISTED").inc(listed)
        return listed

    def _write(self, work: Callable[[], Any]) -> Any:
        # Outcomes are counted only once the transaction has committed.
        self._outcomes = []
        result = super()._write(work)
        for outcome in self._outcomes:
            if outcome == "recorded":
                metrics.PLACEMENTS_RECORDED.inc()
            elif outcome == "duplicate":
                metrics.PLACEMENTS_DUPLICATE.inc()
        self._outcomes = []
        return result

    def _on_event(self, type_: str) -> None:
        metrics.WATCH_EVENTS.labels(type_).inc()

    def _count_processed(self, number: int) -> None:
        super()._count_processed(number)
        limit = self.options.max_events
        if limit is not None and self.processed >= limit:
            logger.info("Handled %d pod events: stopping as asked", self.processed)
            self.shutdown.set()


class NodeStream(StreamWatcher):
    """Nodes: remember each node name's UID so a replacement is noticed."""

    name = NODES
    resource = "nodes"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._known: dict[str, str] = {}

    def apply(self, type_: str, obj: dict[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        name, uid = meta.get("name"), meta.get("uid")
        if type_ == "DELETED" or not name or not uid:
            return "ignored"
        if self._known.get(name) == uid:
            return "same"
        outcome = state.record_node_seen(name=name, uid=uid)
        if outcome == "replaced":
            logger.info("Node %s was replaced (new uid %s)", name, uid)
        self._known[name] = uid
        return outcome

    def save_progress(self, resource_version: str, events: int, relisted=False):
        # Node identity is level-based: every start relists, so only the health
        # fields are kept, and only when something happened.
        if relisted:
            state.save_watch_state(
                name=NODES, resource_version=resource_version, relisted=True
            )

    def process_event(self, event: Any) -> None:
        # Nodes change status every few seconds; only a new UID needs a write.
        if isinstance(event, dict) and event.get("type") in ("MODIFIED", "ADDED"):
            meta = (event.get("object") or {}).get("metadata") or {}
            if meta.get("uid") and self._known.get(meta.get("name")) == meta["uid"]:
                self.resource_version = str(meta.get("resourceVersion") or "")
                return
        if isinstance(event, dict) and event.get("type") == "BOOKMARK":
            meta = (event.get("object") or {}).get("metadata") or {}
            if meta.get("resourceVersion"):
                self.resource_version = str(meta["resourceVersion"])
            return
        super().process_event(event)


def _scheduled_at(status: dict[str, Any]) -> datetime | None:
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, dict)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "True"
        ):
            return kube.parse_time(condition.get("lastTransitionTime"))
    return None


# --------------------------------------------------------------------------- leases


@dataclass
class LeaderElector:
    """Hold the coordination.k8s.io/v1 Lease `name` in `namespace` as `identity`.

    Leadership only avoids duplicate work: counting is exact without it (ledger).
    """

    api: kube.KubeApi
    name: str
    namespace: str
    identity: str
    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    clock: Callable[[], datetime] = timezone.now
    last_renewed: float = field(default=0.0)

    def try_acquire(self) -> bool:
        """Acquire or renew the lease; False if another holder's lease is valid."""
        try:
            return self._try_acquire()
        except Exception as exc:  # noqa: BLE001 - any API failure means "not now"
            failure = kube.classify(exc)
            logger.warning(
                "Lease %s/%s: %s",
                self.namespace,
                self.name,
                failure.detail[:200] if failure else repr(exc),
            )
            return False

    def _try_acquire(self) -> bool:
        now = self.clock()
        lease = self.api.get_lease(name=self.name, namespace=self.namespace)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, now, 0),
            }
            created = self.api.create_lease(namespace=self.namespace, body=body)
            if created:
                self.last_renewed = time.monotonic()
                logger.info("Acquired lease %s/%s", self.namespace, self.name)
            return created
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0)
        acquired = kube.parse_time(spec.get("acquireTime")) or now
        if holder and holder != self.identity:
            renewed = kube.parse_time(spec.get("renewTime"))
            seconds = float(spec.get("leaseDurationSeconds") or self.duration)
            if renewed is not None and renewed + timedelta(seconds=seconds) > now:
                return False
        if holder != self.identity:
            transitions += 1
            acquired = now
        lease["spec"] = self._spec(acquired, now, transitions)
        ok = self.api.replace_lease(
            name=self.name, namespace=self.namespace, body=lease
        )
        if ok:
            if holder != self.identity:
                logger.info(
                    "Acquired lease %s/%s (previous holder %r)",
                    self.namespace,
                    self.name,
                    holder,
                )
            self.last_renewed = time.monotonic()
        return ok

    def _spec(self, acquired: datetime, renewed: datetime, transitions: int):
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration)),
            "acquireTime": kube.micro_time(acquired),
            "renewTime": kube.micro_time(renewed),
            "leaseTransitions": transitions,
        }

    def release(self) -> None:
        """Give the lease up so a standby takes over at once (best effort)."""
        try:
            lease = self.api.get_lease(name=self.name, namespace=self.namespace)
            if lease is None:
                return
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec.update(holderIdentity=None, leaseDurationSeconds=1)
            spec["renewTime"] = kube.micro_time(self.clock() - timedelta(seconds=2))
            lease["spec"] = spec
            self.api.replace_lease(name=self.name, namespace=self.namespace, body=lease)
            logger.info("Released lease %s/%s", self.namespace, self.name)
        except Exception as exc:  # noqa: BLE001 - the lease expires anyway
            logger.warning("Could not release lease %s: %r", self.name, exc)


# --------------------------------------------------------------------------- process


class Watcher:
    """The whole watcher process: pod stream, node thread, optional leadership."""

    def __init__(
        self,
        api: kube.KubeApi,
        *,
        options: Options,
        heartbeat: Heartbeat,
        watch_nodes: bool = True,
        elector: LeaderElector | None = None,
        once: bool = False,
        shutdown: threading.Event | None = None,
    ) -> None:
        self.api = api
        self.options = options
        self.heartbeat = heartbeat
        self.watch_nodes = watch_nodes
        self.elector = elector
        self.once = once
        self.shutdown = shutdown or threading.Event()
        self._leading = threading.Event()
        self.pods: PodStream | None = None
        self.nodes: NodeStream | None = None

    def request_shutdown(self, *_: Any) -> None:
        """Signal handler: stop soon; unblock any open watch."""
        self.shutdown.set()
        for stream in (self.pods, self.nodes):
            if stream is not None:
                stream.interrupt()

    def run(self) -> None:
        if self.elector is None:
            self._run_streams(lost=None)
            return
        try:
            while not self.shutdown.is_set():
                if not self._stand_by():
                    break
                lost = threading.Event()
                renewer = threading.Thread(
                    target=self._renew, args=(lost,), name="lease-renew", daemon=True
                )
                renewer.start()
                self._set_holder(self.elector.identity)
                try:
                    self._run_streams(lost=lost)
                finally:
                    lost.set()
                    renewer.join(timeout=self.elector.retry_period + 5)
                if self.once or self.shutdown.is_set():
                    break
                logger.warning("Lost the lease; standing by")
        finally:
            self.elector.release()

    def _stand_by(self) -> bool:
        """Wait until this replica holds the lease; False on shutdown."""
        logged = False
        while not self.shutdown.is_set():
            if self.elector.try_acquire():
                return True
            if not logged:
                logger.info(
                    "Standing by: lease %s is held by another replica",
                    self.elector.name,
                )
                logged = True
            self.heartbeat.beat()
            if self.shutdown.wait(self.elector.retry_period):
                return False
        return False

    def _renew(self, lost: threading.Event) -> None:
        elector = self.elector
        while not lost.wait(elector.retry_period):
            if elector.try_acquire():
                continue
            if time.monotonic() - elector.last_renewed > elector.renew_deadline:
                logger.warning("Could not renew lease %s in time", elector.name)
                lost.set()
                for stream in (self.pods, self.nodes):
                    if stream is not None:
                        stream.interrupt()
                return

    def _set_holder(self, holder: str) -> None:
        try:
            state.save_watch_state(name=PODS, holder=holder)
        except DatabaseError as exc:
            logger.warning("Cannot record the lease holder: %s", exc)
        finally:
            close_old_connections()

    def _run_streams(self, lost: threading.Event | None) -> None:
        stop = threading.Event()

        def until() -> bool:
            return stop.is_set() or (lost is not None and lost.is_set())

        self.pods = PodStream(
            self.api,
            options=self.options,
            shutdown=self.shutdown,
            heartbeat=self.heartbeat,
        )
        node_thread = None
        if self.watch_nodes and not self.once:
            self.nodes = NodeStream(self.api, options=self.options)
            node_thread = threading.Thread(
                target=self._run_nodes, args=(until,), name="nodes", daemon=True
            )
            node_thread.start()
        try:
            self.pods.start()
            if self.once:
                if not self.pods.watch_once():
                    logger.warning("The single watch pass ended with a fault")
            else:
                self.pods.run(until=until)
        finally:
            stop.set()
            if self.nodes is not None:
                self.nodes.shutdown.set()
                self.nodes.interrupt()
            if node_thread is not None:
                node_thread.join(timeout=10)

    def _run_nodes(self, until: Callable[[], bool]) -> None:
        nodes = self.nodes
        try:
            nodes.run(until=lambda: until() or self.shutdown.is_set())
        except FatalError as exc:
            logger.error("Node watch stopped: %s", exc)
        except Exception:
            logger.exception("Node watch stopped")
        finally:
            connection.close()
