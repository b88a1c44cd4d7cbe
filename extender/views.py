"""The extender endpoints kube-scheduler calls, and the version endpoint.

Each view parses with `wire`, calls a strategy and renders; nothing here writes
to the database. The extender views carry no authentication: only kube-scheduler in
the same pod reaches them (see the deploy notes).
"""

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from rest_framework import exceptions
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView, exception_handler

from extender.admission import PodShapeError
from extender.parsers import ORJSONParser, read_unsized_body
from extender.renderers import (
    ExtenderContentNegotiation,
    ORJSONRenderer,
    PlainTextRenderer,
)
from extender.scoring.strategies import get_strategy
from extender.webhook import explain_webhook
from extender.wire import (
    HostPriorityList,
    extender_filter_result,
    parse_extender_args,
    unique_names,
)
from history.reader import reading_ahead
from kssched import __version__
from kssched.metrics import (
    extender_verb,
    observe_extender_answer,
    record_after_response,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ExtenderView(APIView):
    """Base for the scheduler-facing POST endpoints: no auth, large bodies, orjson."""

    authentication_classes = []
    permission_classes = [AllowAny]
    parser_classes = [ORJSONParser]
    renderer_classes = [ORJSONRenderer]
    content_negotiation_class = ExtenderContentNegotiation
    # POST only: kube-scheduler sends nothing else, and docs/operate.md promises 405.
    http_method_names = ["post"]
    is_extender = True

    throttle_classes = []

    @property
    def max_body_bytes(self) -> int:
        return settings.KSSCHED_MAX_BODY_BYTES

    # Parsers, renderers, the negotiator and AllowAny keep no state between
    # requests: made once per class instead of on every call (DRF makes them per
    # request). Throttles do keep state, and there are none.

    # DRF only iterates what these return: a shared tuple (the stub says list).
    def get_parsers(self) -> tuple[BaseParser, ...]:  # type: ignore[override]
        return _instances(tuple(self.parser_classes))

    def get_renderers(self) -> tuple[BaseRenderer, ...]:  # type: ignore[override]
        return _instances(tuple(self.renderer_classes))

    def get_permissions(self) -> tuple[BasePermission, ...]:
        return _instances(tuple(self.permission_classes))

    def get_content_negotiator(self) -> BaseContentNegotiation:
        # functools.cache's type keeps no type variables: the instance's is said here.
        negotiator: BaseContentNegotiation = _instances(
            (self.content_negotiation_class,)
        )[0]
        return negotiator

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # A chunked body has no Content-Length: read it here, where a 413 or 408
        # is answered like any other error of the request.
        read_unsized_body(request._request, self.max_body_bytes)
        super().initial(request, *args, **kwargs)

    def perform_authentication(self, request: Request) -> None:
        """Nothing to do up front: there are no authenticators, and DRF resolves
        `request.user` (None) lazily if anything asks for it."""

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)
        # Django's list of what close() calls; it has no public way to add one.
        response._resource_closers.append(self.release_body)  # type: ignore[attr-defined]
        return response

    def measured(
        self, response: Response, *, nodes: int, scores: Sequence[int] = ()
    ) -> Response:
        """`response`, with its node count and scores recorded for the metrics
        once it is sent (see `kssched.metrics`)."""
        verb = extender_verb(self.request)
        record_after_response(
            response,
            self.request.path_info,
            lambda: observe_extender_answer(verb, nodes=nodes, scores=scores),
        )
        return response

    def release_body(self) -> None:
        """Drop the decoded body and the reply data once the response is sent.

        DRF links view, request and response in a reference cycle, so without this
        a decoded body (a million objects for 1000 full Nodes) waits for the cyclic
        garbage collector, which must walk all of it. Dropped here, reference
        counting frees it at once (see `extender.parsers.parse_json`).
        """
        request = getattr(self, "request", None)
        if request is not None:
            request._full_data = request._data = None
        response = getattr(self, "response", None)
        if response is not None:
            response.data = None


class HistoryUnavailable(exceptions.APIException):
    """The history could not be read (a 503 whose `Error` kube-scheduler logs)."""

    status_code = 503
    default_code = "history_unavailable"


def read_history(read: Callable[[], T]) -> T:
    """`read()`, tried once more on a new connection when the database session was
    lost (a failover, a restart, `pg_terminate_backend`); HistoryUnavailable when
    the history still cannot be read.

    Only a read outside a transaction is tried again: nothing was written, and a
    new connection sees the same history.
    """
    try:
        return read()
    except (OperationalError, InterfaceError) as exc:
        if connection.in_atomic_block:
            raise HistoryUnavailable(f"history unavailable: {exc}") from exc
        logger.warning(
            "Reading the history failed (%s); trying once more on a new connection",
            str(exc).strip(),
        )
        connection.close()
    except DatabaseError as exc:
        raise HistoryUnavailable(f"history unavailable: {exc}") from exc
    try:
        return read()
    except DatabaseError as exc:
        raise HistoryUnavailable(f"history unavailable: {exc}") from exc


class AlwaysTruePredicateView(ExtenderView):
    """Filter verb `predicates/alwaystrue`: every candidate node passes."""

    def post(self, request: Request) -> Response:
        args = parse_extender_args(request.data)
        result = extender_filter_result(args)
        logger.debug("Filter for pod %s passed all nodes", args.pod_ref())
        return self.measured(Response(result), nodes=args.candidate_count())


class PipelinePriorityView(ExtenderView):
    """Prioritize verb `priorities/pipeline`: one score 0..10 per candidate node."""

    def post(self, request: Request) -> Response:
        started = time.perf_counter()
        # The history's sync starts now and runs while the body is parsed.
        with reading_ahead():
            args = parse_extender_args(request.data)
            nodes = unique_names(args.candidate_names())
            label = args.pod_label(settings.KSSCHED_PIPELINE_LABEL)
            scores = read_history(
                lambda: get_strategy().score(label=label, nodes=nodes)
            )
        logger.debug(
            "Scored %d nodes for pod %s (label %r) in %.1f ms",
            len(nodes),
            args.pod_ref(),
            label,
            (time.perf_counter() - started) * 1000,
        )
        # Rendered straight from the two lists, without a dict per node.
        response = Response(HostPriorityList(nodes, scores))
        return self.measured(response, nodes=len(nodes), scores=scores)


class ExplainView(ExtenderView):
    """`POST /scheduler/explain`: the prioritize body in, each node's score and why.

    Parsing, validation and errors are those of prioritize. The scores come from the
    same strategy code (`?strategy=` picks another one to compare); read-only.
    `?mode=webhook` shows instead the preferred terms the admission webhook would add
    to the Pod (the node lists are not used: the webhook scores every node with
    history), see `extender.webhook.explain_webhook`.
    """

    def post(self, request: Request) -> Response:
        args = parse_extender_args(request.data)
        name = request.query_params.get("strategy") or None
        try:
            strategy = get_strategy(name)
        except ValueError as exc:
            raise exceptions.ValidationError(str(exc)) from None
        mode = request.query_params.get("mode") or "extender"
        if mode == "webhook":
            try:
                return Response(
                    read_history(lambda: explain_webhook(args.pod, strategy=name))
                )
            except PodShapeError as exc:
                raise exceptions.ValidationError(exc.message) from None
        if mode != "extender":
            raise exceptions.ValidationError(
                f"unknown mode {mode!r}; choose from ['extender', 'webhook']"
            )
        nodes = unique_names(args.candidate_names())
        label = args.pod_label(settings.KSSCHED_PIPELINE_LABEL)
        rows = read_history(lambda: strategy.explain(label=label, nodes=nodes))
        return Response({"strategy": strategy.name, "label": label, "nodes": rows})


class VersionView(APIView):
    """`GET /version`: plain text like the old tool, JSON when asked for."""

    authentication_classes = []
    permission_classes = [AllowAny]
    renderer_classes = [PlainTextRenderer, ORJSONRenderer]

    def get(self, request: Request) -> Response:
        version = settings.KSSCHED_VERSION or __version__
        if request.accepted_renderer.format == "txt":
            return Response(version)
        return Response({"version": version})


@functools.cache
def _instances(classes: tuple[type[T], ...]) -> tuple[T, ...]:
    """One shared instance of each of `classes` (stateless DRF components)."""
    return tuple(cls() for cls in classes)


def extender_exception_handler(
    exc: Exception, context: dict[str, Any]
) -> Response | None:
    """DRF's handler everywhere; on extender routes, errors as `{"Error": "..."}`.

    A malformed request is logged at WARNING with what is wrong and answered with a
    4xx; bugs are not handled here and become a logged 500.
    """
    response = exception_handler(exc, context)
    view = context.get("view")
    if response is None or not getattr(view, "is_extender", False):
        return response
    message = _error_message(exc)
    request = context.get("request")
    logger.warning(
        "Rejected %s %s with %d: %s",
        request.method if request else "?",
        request.path if request else "?",
        response.status_code,
        message,
    )
    response.data = {"Error": message}
    return response


def _error_message(exc: Exception) -> str:
    if isinstance(exc, exceptions.ValidationError):
        message: str | None = getattr(exc, "message", None)
        if message:
            return message
    detail = getattr(exc, "detail", exc)
    if isinstance(detail, list) and detail:
        detail = detail[0]
    return str(detail)
