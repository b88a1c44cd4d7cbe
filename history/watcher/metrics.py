"""Prometheus metrics of the watcher process, served by the watcher itself.

They live in their own registry and always keep their values in process memory,
even when PROMETHEUS_MULTIPROC_DIR is set for the web workers: the watcher is one
process with its own HTTP endpoint (`KSSCHED_WATCHER_METRICS_BIND`).
"""

from __future__ import annotations

import logging
import time

from django.db import transaction
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client import values as _values

from history.ledger import RecordedOutcome
from history.models import Placement
from history.timings import UNUSABLE_REASONS
from kssched.valuekinds import bind_parts

logger = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

# Pipeline pods start in seconds to minutes and run for minutes to hours.
PIPELINE_BUCKETS = (
    1, 2, 5, 10, 20, 30, 60, 120, 180, 300, 600, 900, 1200, 1800, 3600, 7200, 14400,
)  # fmt: skip

_previous = _values.ValueClass
_values.ValueClass = _values.MutexValue
try:
    WATCH_EVENTS = Counter(
        "watch_events",
        "Pod watch events and list items handled, by type.",
        ["type"],
        registry=REGISTRY,
    )
    PLACEMENTS_RECORDED = Counter(
        "placements_recorded",
        "Placements entered into the ledger (and counted).",
        registry=REGISTRY,
    )
    PLACEMENTS_DUPLICATE = Counter(
        "placements_duplicate",
        "Bound pods seen again whose UID was already in the ledger.",
        registry=REGISTRY,
    )
    PODS_INVALID_LABEL = Counter(
        "pods_invalid_label",
        "Pod states skipped because their pipeline label is not a valid Kubernetes "
        "label value (each such label is logged once).",
        registry=REGISTRY,
    )
    RELISTS = Counter(
        "relists",
        "Full lists of pods (start without a checkpoint, or after 410 Gone).",
        registry=REGISTRY,
    )
    RECONNECTS = Counter(
        "watch_reconnects",
        "Watch requests that ended with a fault, by reason.",
        ["reason"],
        registry=REGISTRY,
    )
    EVENTS_SKIPPED = Counter(
        "watch_events_skipped",
        "Events (and list items) dropped after a data error on every attempt, by "
        "stream.",
        ["stream"],
        registry=REGISTRY,
    )
    DB_RETRIES = Counter(
        "db_retries",
        "Database transactions retried after an error.",
        registry=REGISTRY,
    )
    LAST_EVENT_AGE = Gauge(
        "last_event_age_seconds",
        "Seconds since the pod stream last delivered an event or bookmark.",
        registry=REGISTRY,
    )
    # Successful runs only, like `manage.py outcomes`; labelled by warmth alone so
    # the number of series stays fixed however many pipelines there are.
    PIPELINE_STARTUP = Histogram(
        "kssched_pipeline_startup_seconds",
        "Seconds from binding to the first container start, of successful pipeline "
        "pods, by warmth of their node.",
        ["warmth"],
        buckets=PIPELINE_BUCKETS,
        registry=REGISTRY,
    )
    PIPELINE_RUN = Histogram(
        "kssched_pipeline_run_seconds",
        "Seconds from the first container start to the last container finish, of "
        "successful pipeline pods, by warmth of their node.",
        ["warmth"],
        buckets=PIPELINE_BUCKETS,
        registry=REGISTRY,
    )
    TIMINGS_UNUSABLE = Counter(
        "kssched_pipeline_timings_unusable",
        "Ended pipeline pods whose times were missing or made no sense, by reason.",
        ["reason"],
        registry=REGISTRY,
    )
    PLACEMENT_EVENTS = Counter(
        "kssched_placement_events",
        "Kubernetes Events on pipeline pods about their placement, by result: "
        "written, dropped (over the rate), failed, forbidden (RBAC missing: no more "
        "are tried).",
        ["result"],
        registry=REGISTRY,
    )
finally:
    _values.ValueClass = _previous

for _warmth in Placement.Warmth.values:
    PIPELINE_STARTUP.labels(_warmth)
    PIPELINE_RUN.labels(_warmth)
for _reason in UNUSABLE_REASONS:
    TIMINGS_UNUSABLE.labels(_reason)
for _result in ("written", "dropped", "failed", "forbidden"):
    PLACEMENT_EVENTS.labels(_result)

_last_event = time.monotonic()
LAST_EVENT_AGE.set_function(lambda: time.monotonic() - _last_event)


def mark_event() -> None:
    """Note that the pod stream made progress now."""
    global _last_event
    _last_event = time.monotonic()


def observe_outcome(recorded: RecordedOutcome | None, *, unusable: str = "") -> None:
    """Count a pod whose outcome was just recorded, once its transaction commits.

    A successful run with both times goes into the histograms; an ended pod whose
    times are `unusable` is counted by reason. A rolled-back transaction (retried by
    the watcher) observes nothing.
    """
    if recorded is None:
        return

    def observe() -> None:
        if unusable:
            TIMINGS_UNUSABLE.labels(unusable).inc()
        elif (
            recorded.outcome == Placement.Outcome.SUCCEEDED
            and recorded.warmth
            and recorded.startup is not None
            and recorded.run is not None
        ):
            PIPELINE_STARTUP.labels(recorded.warmth).observe(recorded.startup)
            PIPELINE_RUN.labels(recorded.warmth).observe(recorded.run)

    transaction.on_commit(observe)


def serve(address: str) -> None:
    """Serve the registry on `address` (HOST:PORT, as kssched.variables accepts it)
    in a daemon thread; empty turns it off."""
    if not address:
        return
    host, port = bind_parts(address)
    try:
        start_http_server(port, addr=host, registry=REGISTRY)
    except OSError as exc:
        # Metrics are not worth stopping the counting for.
        logger.error("Cannot serve watcher metrics on %s: %s", address, exc)
        return
    logger.info("Serving watcher metrics on %s", address)
