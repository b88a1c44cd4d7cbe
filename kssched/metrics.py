"""Prometheus metrics of the web process, served at `/metrics`.

Extender requests are measured by `kssched.middleware.ExtenderMiddleware`, which
calls `observe_extender_request` once per request (latency, errors); the extender
views call `observe_extender_answer` with their node count and scores. Under
gunicorn every worker is its own process: with PROMETHEUS_MULTIPROC_DIR set (the
shipped manifests set it), each worker writes its values to files in that directory
and `/metrics` adds them up, whichever worker answers the scrape. The gunicorn
config empties the directory at start. Without it, values live in the process (fine
for `runserver` and tests).

The watcher's progress and the placement ledger are read from the database at
scrape time (`HistoryCollector`), so they are right whichever process serves the
scrape, and stay visible while the watcher is down. So are the weight bands of what
warmth is worth, from the serving process's own book (`history.worth_feed`), which
it reads again at most every KSSCHED_WORTH_REFRESH_SECONDS.
"""

from __future__ import annotations

import hmac
import logging
from collections import Counter as _Tally
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar, cast

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_safe
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics import MetricWrapperBase

from kssched import config
from kssched.config import EXTENDER_PREFIX

if TYPE_CHECKING:
    from history.watcher.health import StreamHealth

logger = logging.getLogger(__name__)

# From 0.5 ms (a warm prioritize of a few nodes) to 5 s (kube-scheduler's default
# httpTimeout); anything slower is a timeout on the scheduler's side anyway.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
NODE_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)

REQUEST_SECONDS = Histogram(
    "kssched_extender_request_seconds",
    "Time to answer an extender request, by verb (whole request in the web process).",
    ["verb"],
    buckets=LATENCY_BUCKETS,
)
REQUEST_NODES = Histogram(
    "kssched_extender_request_nodes",
    "Candidate nodes per successful extender request, by verb.",
    ["verb"],
    buckets=NODE_BUCKETS,
)
SCORES = Counter(
    "kssched_extender_scores",
    "Scores returned by prioritize, by score (0..10).",
    ["score"],
)
ERRORS = Counter(
    "kssched_extender_errors",
    "Extender requests not answered with 200, by verb and reason.",
    ["verb", "reason"],
)
DROPPED = Counter(
    "kssched_connections_dropped",
    "Connections closed before their request was served, by listener and reason "
    "(read_timeout, tls_handshake, too_many).",
    ["listener", "reason"],
)

_REASONS = {
    400: "bad_request",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "read_timeout",
    413: "body_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    417: "expectation_failed",
    431: "header_fields_too_large",
    500: "server_error",
    # The extender's answer when the history cannot be read (extender.views).
    501: "not_implemented",
    503: "database_error",
}


def observe_extender_request(
    verb: str,
    seconds: float,
    *,
    status: int,
    exception: BaseException | None = None,
) -> None:
    """Record one extender request: its latency, and its error unless a 200.

    `exception` is what the view raised, if anything: it names the error's kind.
    """
    _child(REQUEST_SECONDS, verb).observe(seconds)
    if status != 200:
        _child(ERRORS, verb, _error_reason(status, exception)).inc()


def observe_extender_answer(
    verb: str, *, nodes: int, scores: Sequence[int] = ()
) -> None:
    """Record what an extender request answered: how many nodes, and their scores
    (prioritize). The cost is a few label look-ups plus one C-level tally."""
    _child(REQUEST_NODES, verb).observe(nodes)
    for score, count in _tally(scores).items():
        _child(SCORES, str(score)).inc(count)


def record_after_response(
    response: HttpResponseBase, path: str, record: Callable[[], None]
) -> None:
    """Call `record` when the server closes `response`, after the reply went out
    (every WSGI server closes it, as does Django's test client): kube-scheduler
    does not wait for the metrics. A failure is logged with `path`, since Django's
    close() would hide it."""

    def closer() -> None:
        try:
            record()
        except Exception:
            logger.exception("Could not record metrics for %s", path)

    # Django's list of what close() calls; it has no public way to add one.
    response._resource_closers.append(closer)  # type: ignore[attr-defined]


# Label values are few (verbs, 11 scores, error reasons): keep each labelled child
# instead of looking it up under the metric's lock on every request.
_children: dict[tuple[MetricWrapperBase, tuple[str, ...]], MetricWrapperBase] = {}

_Metric = TypeVar("_Metric", bound=MetricWrapperBase)


def _child(metric: _Metric, *labels: str) -> _Metric:
    child = _children.get((metric, labels))
    if child is None:
        child = _children[(metric, labels)] = metric.labels(*labels)
    # Each key's child was made by its own metric's labels(), so it has its type.
    return cast(_Metric, child)


def _tally(scores: Sequence[int]) -> dict[int, int]:
    """How often each score occurs. Scores are 0..10, so a bytes object counts them
    in C (about 8 us for 1000 nodes); anything else falls back to Counter."""
    try:
        packed = bytes(scores)
    except (TypeError, ValueError):
        return dict(_Tally(scores))
    tally = {score: count for score in range(11) if (count := packed.count(score))}
    if sum(tally.values()) != len(packed):
        return dict(_Tally(scores))
    return tally


def extender_verb(request: HttpRequest) -> str:
    """The verb (`priorities/pipeline`) of a known extender route, else "unknown".

    Only resolved routes give their path, so random paths cannot create new series.
    """
    if getattr(request, "resolver_match", None) is None:
        return verb_for_path(request.path_info)
    return request.path_info[len(EXTENDER_PREFIX) :]


def verb_for_path(path: str | None) -> str:
    """The verb of an extender route's path, "unknown" for any other path."""
    if not path or not path.startswith(EXTENDER_PREFIX):
        return "unknown"
    from django.urls import Resolver404, resolve

    try:
        resolve(path)
    except Resolver404:
        return "unknown"
    return path[len(EXTENDER_PREFIX) :]


def count_extender_error(path: str | None, reason: str | int) -> None:
    """Count a call that the worker answered itself (a malformed head, a request
    not received in time): `reason`, or the reason of a status code."""
    try:
        if isinstance(reason, int):
            reason = _REASONS.get(reason, f"http_{reason}")
        _child(ERRORS, verb_for_path(path), reason).inc()
    except Exception:  # never fails the worker that answers
        logger.exception("Could not count an extender error (%s)", reason)


def count_dropped_connection(listener: str, reason: str) -> None:
    """Count a connection a worker closed before it had a request to serve."""
    try:
        DROPPED.labels(listener, reason).inc()
    except Exception:  # never fails the worker
        logger.exception("Could not count a dropped connection (%s)", reason)


def _error_reason(status: int, exception: BaseException | None) -> str:
    if exception is not None:
        from django.db import DatabaseError

        return "database_error" if isinstance(exception, DatabaseError) else "exception"
    return _REASONS.get(status, f"http_{status}")


class HistoryCollector:
    """Watcher progress and placement ledger, read from the database per scrape.

    Two small queries: the WatchState rows and one aggregate over Placement; and,
    once KSSCHED_WORTH_REFRESH_SECONDS have passed, the book of what warmth is worth
    reads the outcomes of the pods ended since it last did. If the database does not
    answer, only `kssched_database_up 0` is exported.
    """

    def describe(self) -> list[Metric]:
        # Nothing at registration: no database access at import time.
        return []

    def collect(self) -> Iterator[Metric]:
        from django.db import DatabaseError
        from django.db.models import Count, Q

        from history.models import Placement
        from history.watcher.health import stream_health

        up = GaugeMetricFamily(
            "kssched_database_up",
            "1 when the database answered the metrics queries, else 0.",
        )
        try:
            streams = stream_health()
            ledger = Placement.objects.aggregate(
                total=Count("pk"),
                active=Count("pk", filter=Q(finished_at__isnull=True)),
                **{
                    warmth: Count("pk", filter=Q(warmth=warmth))
                    for warmth in _warmth_values()
                },
            )
        except DatabaseError as exc:
            logger.warning("Metrics: database did not answer: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from self._watch_metrics(streams)
        yield from self._ledger_metrics(ledger)
        yield from self._worth_metrics()
        yield self._depth_metric()

    def _watch_metrics(self, streams: list[StreamHealth]) -> Iterator[Metric]:
        from history.watcher.health import seconds_since

        now = timezone.now()
        events = CounterMetricFamily(
            "kssched_watch_events",
            "Watch events the watcher committed, by stream (pods, nodes).",
            labels=["stream"],
        )
        relists = CounterMetricFamily(
            "kssched_watch_relists",
            "Full relists by the watcher, by stream.",
            labels=["stream"],
        )
        skipped = CounterMetricFamily(
            "kssched_watch_events_skipped",
            "Watch events the watcher dropped because they could not be written, "
            "by stream.",
            labels=["stream"],
        )
        event_age = GaugeMetricFamily(
            "kssched_watch_last_event_age_seconds",
            "Seconds since the watcher committed the stream's last event.",
            labels=["stream"],
        )
        staleness = GaugeMetricFamily(
            "kssched_counts_staleness_seconds",
            "Seconds since the watcher last committed an event or heartbeat, by "
            "stream: how old the counts the extender serves may be.",
            labels=["stream"],
        )
        for stream in streams:
            events.add_metric([stream.name], stream.events)
            relists.add_metric([stream.name], stream.relists)
            skipped.add_metric([stream.name], stream.skipped_events)
            age = seconds_since(stream.last_event_at, now)
            if age is not None:
                event_age.add_metric([stream.name], age)
            stale = seconds_since(stream.last_progress_at, now)
            if stale is not None:
                staleness.add_metric([stream.name], stale)
        yield from (events, relists, skipped, event_age, staleness)

    def _ledger_metrics(self, ledger: dict[str, int]) -> Iterator[Metric]:
        recorded = CounterMetricFamily(
            "kssched_placements",
            "Placements recorded in the ledger (each pod counted once).",
        )
        recorded.add_metric([], ledger["total"])
        active = GaugeMetricFamily(
            "kssched_placements_active",
            "Recorded placements whose pod has not finished yet.",
        )
        active.add_metric([], ledger["active"])
        warmth = CounterMetricFamily(
            "kssched_placements_warmth",
            "Recorded placements by warmth of the chosen node: exact (the most "
            "specific segment had history there), partial (a more general one), cold.",
            labels=["warmth"],
        )
        for value in _warmth_values():
            warmth.add_metric([value], ledger[value])
        yield from (recorded, active, warmth)

    def _depth_metric(self) -> Metric:
        """The workspace depth `warm` scores with in the serving process
        (`history.depth_feed`; with `auto`, read again first once it is time)."""
        from history.depth_feed import process_depth

        feed = process_depth()
        if settings.KSSCHED_WORKSPACE_DEPTH == "auto":
            feed.refresh()
        depth = GaugeMetricFamily(
            "kssched_workspace_depth",
            "Other pipelines placed on a node since a pipeline, from which warm counts "
            "its workspace gone there (KSSCHED_WORKSPACE_DEPTH, or the depth measured "
            "with auto); 0: none counts as gone.",
        )
        depth.add_metric([], feed.current())
        return depth

    def _worth_metrics(self) -> Iterator[Metric]:
        """How many pipelines the serving process's book of what warmth is worth
        (`history.worth_feed`) has at each weight band, read again first once it is
        time (never waiting for another thread's read); and whether `warm` applies
        the weights. The bands are the learned ones even when it does not: what
        KSSCHED_WORTH=auto would do."""
        from history.worth import BANDS
        from history.worth_feed import process_worth

        feed = process_worth()
        feed.refresh()
        with feed.lock:
            counts = feed.book.bands()
        bands = GaugeMetricFamily(
            "kssched_pipeline_worth_pipelines",
            "Pipelines by the weight warm learned to scale their pull by: off (0), "
            "weaker (below 1), default (1), stronger (above 1); this process's book.",
            labels=["band"],
        )
        for band in BANDS:
            bands.add_metric([band], counts.get(band, 0))
        applied = GaugeMetricFamily(
            "kssched_pipeline_worth_applied",
            "1 when scoring applies the learned weights (KSSCHED_SCORING=warm and "
            "KSSCHED_WORTH=auto), else 0: every pipeline gets weight 1.",
        )
        applied.add_metric(
            [],
            int(
                settings.KSSCHED_SCORING == "warm" and settings.KSSCHED_WORTH == "auto"
            ),
        )
        yield from (bands, applied)


def _warmth_values() -> list[str]:
    from history.models import Placement

    return Placement.Warmth.values


_history_registry = CollectorRegistry(auto_describe=False)
_history_registry.register(HistoryCollector())


def _process_registry() -> CollectorRegistry:
    """The registry holding this process's metrics, or all workers' in multiprocess."""
    if config.load().metrics_dir:
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text format. Open unless KSSCHED_METRICS_TOKEN is set; then it
    needs `Authorization: Bearer <token>`."""
    token = settings.KSSCHED_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return JsonResponse(
                {"error": "metrics need 'Authorization: Bearer <token>'"}, status=401
            )
    output = generate_latest(_process_registry()) + generate_latest(_history_registry)
    # The classic text format: every Prometheus version parses it.
    return HttpResponse(output, content_type=CONTENT_TYPE_PLAIN_0_0_4)
