"""Wire shapes of the mutating admission webhook: `admission.k8s.io/v1` AdmissionReview.

The API server posts an AdmissionReview whose `request` carries a `uid` and the
object; the answer is an AdmissionReview whose `response` echoes that `uid`, always
sets `allowed` and, to change the pod, carries a base64 RFC 6902 JSON Patch with
`patchType: JSONPatch`. Keys keep their upstream (camelCase) names.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson

from history.labels import label_value_problem

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
# The field selector key that matches a node by its name. The API server accepts one
# value per such requirement, and the requirements of one term are ANDed: one term
# per node.
NODE_NAME_FIELD = "metadata.name"


class AdmissionReviewError(Exception):
    """The body is not an AdmissionReview the webhook can answer (a 400)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class PodShapeError(Exception):
    """The review is well formed but its pod cannot be handled (admitted unchanged,
    with a warning)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """The parts of `request` the webhook reads."""

    uid: str
    kind: dict[str, Any]
    operation: str
    object: object
    namespace: str
    name: str
    dry_run: bool

    @property
    def is_pod_create(self) -> bool:
        """True for the creation of a core/v1 Pod (not a subresource)."""
        return (
            self.operation == "CREATE"
            and self.kind.get("kind") == "Pod"
            and not self.kind.get("group")
        )

    def pod_ref(self) -> str:
        """`namespace/name` for logs (generateName pods have no name yet)."""
        name = self.name
        if not name and isinstance(self.object, dict):
            metadata = self.object.get("metadata")
            if isinstance(metadata, dict):
                name = metadata.get("name") or metadata.get("generateName") or ""
        return f"{self.namespace or '?'}/{name or '?'}"


def parse_admission_review(data: object) -> AdmissionRequest:
    """Check a decoded body and return its request.

    Raises AdmissionReviewError naming the first problem: not an object, another
    apiVersion or kind, no `request` object, no `request.uid` string.
    """
    if not isinstance(data, dict):
        raise AdmissionReviewError(
            f"request body must be a JSON object (AdmissionReview), "
            f"not {type(data).__name__}"
        )
    if data.get("apiVersion") != API_VERSION or data.get("kind") != KIND:
        raise AdmissionReviewError(
            f"expected apiVersion {API_VERSION} and kind {KIND}, got "
            f"{data.get('apiVersion')!r} and {data.get('kind')!r}"
        )
    request = data.get("request")
    if not isinstance(request, dict):
        raise AdmissionReviewError("AdmissionReview.request must be an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise AdmissionReviewError("AdmissionReview.request.uid must be a string")
    kind = request.get("kind")
    return AdmissionRequest(
        uid=uid,
        kind=kind if isinstance(kind, dict) else {},
        operation=str(request.get("operation") or ""),
        object=request.get("object"),
        namespace=str(request.get("namespace") or ""),
        name=str(request.get("name") or ""),
        dry_run=request.get("dryRun") is True,
    )


def admission_response(
    uid: str, *, patch: list[dict[str, Any]] | None = None, warnings: Sequence[str] = ()
) -> dict[str, Any]:
    """The AdmissionReview answer: allowed, with `patch` (JSON Patch operations) when
    given and non-empty, and `warnings` when any."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    if warnings:
        response["warnings"] = list(warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def pod_label(pod: dict[str, Any], label: str) -> str | None:
    """The value of `label` on `pod`, None when absent; PodShapeError when the
    metadata is not shaped like a Pod's.

    The one reading of a pod's label: the webhook's, and the extender's
    (`ExtenderArgs.pod_label`, which also checks the value).
    """
    metadata = pod.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise PodShapeError("Pod.metadata must be an object")
    labels = metadata.get("labels")
    if labels is None:
        return None
    if not isinstance(labels, dict):
        raise PodShapeError("Pod.metadata.labels must be an object")
    value = labels.get(label)
    if value is None:
        return None
    problem = label_value_problem(label, value)
    if problem:
        raise PodShapeError(problem)
    # label_value_problem refused every value but a string.
    return cast(str, value)


def pod_spec(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod.spec`, or PodShapeError."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise PodShapeError("Pod spec is missing or not an object")
    return spec


def preferred_term(node: str, weight: int) -> dict[str, Any]:
    """A PreferredSchedulingTerm that matches the node named `node`."""
    return {
        "weight": weight,
        "preference": {
            "matchFields": [
                {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}
            ]
        },
    }


def affinity_patch(
    pod: dict[str, Any], terms: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """JSON Patch operations that append `terms` to the pod's preferred node affinity.

    Only `add` operations: an absent `affinity`, `nodeAffinity` or preferred list is
    added whole (a JSON Patch `add` needs its parent to exist), an existing list is
    appended to, so the pod's own terms, required affinity, pod (anti-)affinity and
    tolerations stay as they are. Raises PodShapeError when one of those fields has
    the wrong type.
    """
    if not terms:
        return []
    spec = pod_spec(pod)
    affinity = spec.get("affinity")
    if affinity is None:
        whole = {"nodeAffinity": {PREFERRED: list(terms)}}
        return [{"op": "add", "path": "/spec/affinity", "value": whole}]
    if not isinstance(affinity, dict):
        raise PodShapeError("Pod spec.affinity is not an object")
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is None:
        node_value = {PREFERRED: list(terms)}
        return [
            {"op": "add", "path": "/spec/affinity/nodeAffinity", "value": node_value}
        ]
    if not isinstance(node_affinity, dict):
        raise PodShapeError("Pod spec.affinity.nodeAffinity is not an object")
    path = f"/spec/affinity/nodeAffinity/{PREFERRED}"
    preferred = node_affinity.get(PREFERRED)
    if preferred is None:
        return [{"op": "add", "path": path, "value": list(terms)}]
    if not isinstance(preferred, list):
        raise PodShapeError(f"Pod nodeAffinity.{PREFERRED} is not a list")
    return [{"op": "add", "path": f"{path}/-", "value": term} for term in terms]
