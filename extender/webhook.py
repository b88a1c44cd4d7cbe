"""Webhook mode: `POST /webhook/mutate`, a mutating admission webhook for pipeline pods.

The cluster's default scheduler places the pods; the webhook only adds preferred
node-affinity terms for the warm nodes to each new pipeline pod (see
`extender.scoring.steering`). It never blocks a pod: every well-formed review is
answered `allowed: true`, a pod it cannot handle gets a warning instead of a patch,
and a body that is not an AdmissionReview gets a 400 (the API server then admits
the pod unchanged under `failurePolicy: Ignore`).

The route is not under /scheduler/: the API server calls it from outside the pod,
over the web listener's TLS.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DatabaseError
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from extender.admission import (
    AdmissionRequest,
    AdmissionReviewError,
    PodShapeError,
    admission_response,
    affinity_patch,
    parse_admission_review,
    pod_label,
    pod_spec,
    preferred_term,
)
from extender.parsers import ORJSONParser, read_unsized_body
from extender.renderers import ExtenderContentNegotiation, ORJSONRenderer
from extender.scoring.steering import (
    MIN_TERM_SCORE,
    Plan,
    SteeringMemory,
    plan_terms,
    process_memory,
    remember_plan,
)
from extender.scoring.strategies import get_strategy
from history.labels import split_pipeline_label
from history.nodenames import is_valid_node_name
from history.reader import history_reader

if TYPE_CHECKING:
    from extender.scoring.strategies import Strategy
    from history.reader import HistoryReader

logger = logging.getLogger(__name__)

WARNING_PREFIX = "ks-scheduler: "
# Steered pods one label may have in a worker's memory at once. Anyone who reaches
# the web port can post reviews, and each remembered one counts as a running pod of
# the label; the cap bounds what reviews alone can do to a label's scores to a
# plausible fan-out (wider bursts spread over the warm nodes already, and
# kube-scheduler's resource scoring spreads the rest).
MAX_STEERED_PER_LABEL = 64


def pod_decision(pod: dict[str, Any], namespace: str = "") -> tuple[str | None, str]:
    """(label, why) for a pod being created in `namespace` (else the one its
    metadata names): the label when the webhook should add terms, else None and
    the reason. Raises PodShapeError for a malformed pod.

    Pods of KSSCHED_WEBHOOK_SKIP_NAMESPACES are left alone here as well as by the
    namespaceSelector, whose `kubernetes.io/metadata.name` label namespaces only
    carry from Kubernetes 1.21 on."""
    label = pod_label(pod, settings.KSSCHED_PIPELINE_LABEL)
    spec = pod_spec(pod)
    namespace = namespace or _pod_namespace(pod)
    if namespace in settings.KSSCHED_WEBHOOK_SKIP_NAMESPACES:
        return None, (f"namespace {namespace} is in KSSCHED_WEBHOOK_SKIP_NAMESPACES")
    if spec.get("nodeName"):
        return None, "the pod names its node (spec.nodeName)"
    if spec.get("schedulerName") == settings.KSSCHED_SCHEDULER_NAME:
        return None, (
            f"the pod names schedulerName {settings.KSSCHED_SCHEDULER_NAME}: "
            "the extender scores it"
        )
    if label is None:
        return None, f"the pod has no {settings.KSSCHED_PIPELINE_LABEL} label"
    if not split_pipeline_label(label):
        return None, "the pipeline label has no segment"
    return label, "pipeline pod"


def _pod_namespace(pod: dict[str, Any]) -> str:
    metadata = pod.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    return namespace if isinstance(namespace, str) else ""


def patch_terms(plan: Plan) -> list[dict[str, Any]]:
    """The preferred terms for `plan`'s nodes, leaving out any stored node name the
    API server would not accept (a row written before names were checked, see
    `history.nodenames`): a pod given such a term is rejected."""
    return [
        preferred_term(term.node, term.weight)
        for term in plan.terms
        if is_valid_node_name(term.node)
    ]


def patch_for(pod: dict[str, Any], plan: Plan) -> list[dict[str, Any]]:
    """The JSON Patch that adds `plan`'s terms to `pod` (empty without terms)."""
    return affinity_patch(pod, patch_terms(plan))


def answer_review(
    request: AdmissionRequest, *, memory: SteeringMemory, now: float
) -> dict[str, Any]:
    """The AdmissionReview answer for `request`: always allowed; a patch for a new
    pipeline pod with warm nodes; a warning when the pod or the history cannot be
    read. Remembers the steered pod unless the request is a dry run."""
    uid = request.uid
    if not request.is_pod_create:
        return admission_response(uid)
    pod = request.object
    try:
        if not isinstance(pod, dict):
            raise PodShapeError("the review carries no Pod object")
        label, why = pod_decision(pod, request.namespace)
        if label is None:
            logger.debug("No terms for pod %s: %s", request.pod_ref(), why)
            return admission_response(uid)
        pool = history_reader().pool(now=now, days=settings.KSSCHED_WEBHOOK_POOL_DAYS)
        plan = plan_terms(label=label, memory=memory, now=now, pool=pool)
        patch = patch_for(pod, plan)
    except PodShapeError as exc:
        logger.warning("Admitted pod %s unchanged: %s", request.pod_ref(), exc.message)
        return admission_response(
            uid, warnings=[f"{WARNING_PREFIX}no node preferences added: {exc.message}"]
        )
    except DatabaseError as exc:
        logger.warning(
            "Admitted pod %s unchanged: history unavailable (%s)",
            request.pod_ref(),
            exc,
        )
        return admission_response(
            uid,
            warnings=[
                f"{WARNING_PREFIX}no node preferences added: history unavailable"
            ],
        )
    if not request.dry_run and sum(plan.steered.values()) < MAX_STEERED_PER_LABEL:
        remember_plan(plan, memory=memory, now=now)
    logger.debug(
        "Pod %s (label %r): %d preferred terms, heaviest on %s",
        request.pod_ref(),
        label,
        len(plan.terms),
        plan.target,
    )
    return admission_response(uid, patch=patch)


class WebhookMutateView(APIView):
    """`POST /webhook/mutate`: an AdmissionReview in, an AdmissionReview out."""

    authentication_classes = []
    permission_classes = [AllowAny]
    parser_classes = [ORJSONParser]
    renderer_classes = [ORJSONRenderer]
    content_negotiation_class = ExtenderContentNegotiation
    throttle_classes = []
    http_method_names = ["post", "options"]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # The API server may send the review chunked (no Content-Length), which
        # Django reads as empty: read it here, up to the parser's limit.
        read_unsized_body(request._request, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        super().initial(request, *args, **kwargs)

    def post(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            review = parse_admission_review(request.data)
        except (ParseError, UnsupportedMediaType) as exc:
            return _bad_request(request, str(exc.detail))
        except AdmissionReviewError as exc:
            return _bad_request(request, exc.message)
        answer = answer_review(review, memory=process_memory(), now=time.time())
        logger.debug(
            "Answered review %s in %.1f ms",
            review.uid,
            (time.perf_counter() - started) * 1000,
        )
        return Response(answer)


def _bad_request(request: Request, message: str) -> Response:
    """A 400 for a body that is not an AdmissionReview (logged at WARNING)."""
    logger.warning("Rejected %s with 400: %s", request.path, message)
    return Response({"detail": message}, status=400)


def explain_webhook(
    pod: dict[str, Any], *, strategy: str | None = None
) -> dict[str, Any]:
    """The dry run behind `POST /scheduler/explain?mode=webhook`: the terms the
    webhook would add to `pod` now, the patch, and each scored node's reasons.

    Read-only: the steering memory is read, never written. Keys: mode, strategy,
    label, patched, reason, terms, patch, nodes (the strategy's explanation of each
    node with history, a term or steered pods, plus steered_pods, weight and
    term), pool (how many nodes the load rule's mean is taken over).
    """
    memory = process_memory()
    label, reason = pod_decision(pod)
    body: dict[str, Any] = {
        "mode": "webhook",
        "strategy": strategy or settings.KSSCHED_SCORING,
        "label": pod_label(pod, settings.KSSCHED_PIPELINE_LABEL),
        "patched": False,
        "reason": reason,
        "max_nodes": settings.KSSCHED_WEBHOOK_MAX_NODES,
        "memory_seconds": settings.KSSCHED_WEBHOOK_MEMORY_SECONDS,
        "terms": [],
        "patch": [],
        "nodes": [],
    }
    if label is None:
        return body
    now = time.time()
    plan = plan_terms(
        label=label,
        memory=memory,
        now=now,
        make_strategy=_named(strategy),
        pool=history_reader().pool(now=now, days=settings.KSSCHED_WEBHOOK_POOL_DAYS),
    )
    assert plan.strategy is not None
    body["strategy"] = plan.strategy.name
    weights = {term.node: term.weight for term in plan.terms}
    dropped = set(plan.dropped)
    # Scored over the whole pool (the load rule's mean), shown for the nodes with
    # history, a term or steered pods.
    assert plan.history is not None
    shown = plan.history.nodes() | weights.keys() | plan.steered.keys()
    rows = [
        row
        for row in plan.strategy.explain(label=label, nodes=plan.nodes, now=now)
        if row["node"] in shown
    ]
    for row in rows:
        node = row["node"]
        row["steered_pods"] = plan.steered.get(node, 0)
        row["weight"] = weights.get(node)
        if node in weights and not is_valid_node_name(node):
            row["term"] = "none: not a Kubernetes node name (see manage.py check)"
        elif node in weights:
            row["term"] = f"weight {weights[node]} from score {row['score']}"
        elif node in dropped:
            row["term"] = (
                f"none: beyond the {settings.KSSCHED_WEBHOOK_MAX_NODES} warmest nodes"
            )
        else:
            row["term"] = (
                f"none: score {row['score']} (only scores of {MIN_TERM_SCORE} "
                "or more get one)"
            )
    body["nodes"] = rows
    body["pool"] = len(plan.nodes)
    body["terms"] = patch_terms(plan)
    body["patch"] = patch_for(pod, plan)
    body["patched"] = bool(body["patch"])
    if not body["terms"]:
        body["reason"] = f"no node with history scores {MIN_TERM_SCORE} or more"
    return body


def _named(name: str | None) -> Callable[[HistoryReader], Strategy]:
    """A strategy factory for `plan_terms` (None: the configured strategy)."""
    return lambda reader: get_strategy(name, reader=reader)
