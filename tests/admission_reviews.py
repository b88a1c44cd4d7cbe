"""AdmissionReviews as the API server sends them, and what the webhook's answer does
to a pod: shared by the webhook tests."""

import base64
import copy

import kubernetes_validate
import orjson

from tests.fakeapi import make_pod

URL = "/webhook/mutate"
UID = "705ab4f5-6393-11e8-b7cc-42010a800002"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
SCHEMA_VERSIONS = ("1.25", kubernetes_validate.latest_version())


def new_pod(label="ci-java-app", **spec):
    """A pod as the API server admits it: no node, the default scheduler."""
    pod = make_pod("build-1", label=label, scheduler="default-scheduler")
    pod["metadata"].pop("uid")
    pod["metadata"].pop("resourceVersion")
    pod["status"] = {}
    pod["spec"].update(spec)
    return pod


def review(pod, *, operation="CREATE", kind="Pod", group="", dry_run=False, uid=UID):
    resource = {"group": group, "version": "v1", "resource": kind.lower() + "s"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": resource,
            "requestKind": {"group": group, "version": "v1", "kind": kind},
            "requestResource": resource,
            "name": "build-1",
            "namespace": "ci",
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:ci:runner",
                "groups": ["system:serviceaccounts"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def post(client, body, url=URL, content_type="application/json"):
    if not isinstance(body, bytes):
        body = orjson.dumps(body)
    return client.generic("POST", url, body, content_type=content_type)


def answer(client, body):
    response = post(client, body)
    assert response.status_code == 200, response.content
    data = orjson.loads(response.content)
    assert data["apiVersion"] == "admission.k8s.io/v1"
    assert data["kind"] == "AdmissionReview"
    assert data["response"]["uid"] == UID
    assert data["response"]["allowed"] is True
    return data["response"]


def decoded_patch(response) -> list[dict]:
    assert response["patchType"] == "JSONPatch"
    return orjson.loads(base64.b64decode(response["patch"]))


def apply_patch(document, patch):
    """RFC 6902 `add` (the only operation the webhook sends) on a copy."""
    document = copy.deepcopy(document)
    for operation in patch:
        assert operation["op"] == "add", operation
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~")
            for part in operation["path"].split("/")[1:]
        ]
        target = document
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            position = len(target) if last == "-" else int(last)
            target.insert(position, operation["value"])
        else:
            target[last] = operation["value"]
    return document


def patched(pod, response):
    """The pod after the patch, checked against the Pod schema."""
    result = apply_patch(pod, decoded_patch(response))
    for version in SCHEMA_VERSIONS:
        kubernetes_validate.validate(result, version, strict=True)
    return result


def preferred_nodes(pod):
    terms = pod["spec"]["affinity"]["nodeAffinity"][PREFERRED]
    named = {}
    for term in terms:
        (requirement,) = term["preference"]["matchFields"]
        assert requirement["key"] == "metadata.name"
        assert requirement["operator"] == "In"
        (node,) = requirement["values"]
        named[node] = term["weight"]
    return named
