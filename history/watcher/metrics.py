"""Prometheus metrics of the watcher process, served by the watcher itself.

They live in their own registry and always keep their values in process memory,
even when PROMETHEUS_MULTIPROC_DIR is set for the web workers: the watcher is one
process with its own HTTP endpoint (`KSSCHED_WATCHER_METRICS_PORT`).
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client import values as _values

logger = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

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
finally:
    _values.ValueClass = _previous

_last_event = time.monotonic()
LAST_EVENT_AGE.set_function(lambda: time.monotonic() - _last_event)


def mark_event() -> None:
    """Note that the pod stream made progress now."""
    global _last_event
    _last_event = time.monotonic()


def serve(port: int) -> None:
    """Serve the registry on 0.0.0.0:`port` in a daemon thread; 0 turns it off."""
    if not port:
        return
    try:
        start_http_server(port, registry=REGISTRY)
    except OSError as exc:
        # Metrics are not worth stopping the counting for.
        logger.error("Cannot serve watcher metrics on port %s: %s", port, exc)
        return
    logger.info("Serving watcher metrics on port %s", port)
