"""Cluster-mode answers to list, get, create, update and delete.

Each function returns ``(status code, JSON body)``; the handler writes it. The
watch verb streams and lives in ``watch.py``.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

from tests.fakeapi.actions import conflict
from tests.fakeapi.objects import RESOURCES, qualified_name
from tests.fakeapi.routing import RecordedRequest
from tests.fakeapi.selectors import Selector
from tests.fakeapi.store import Store
from tests.fakeapi.wire import status_body


def list_objects(
    store: Store, rec: RecordedRequest, selector: Selector
) -> tuple[int, dict[str, Any]]:
    """Answer a list, paged by ``limit`` and an opaque ``continue`` token.

    The token keeps the first page's resourceVersion, as the API server's does.
    """
    kind, api_version, _, _ = RESOURCES[rec.resource]
    with store.cond:
        items = [
            copy.deepcopy(o)
            for _, o in sorted(store.collections[rec.resource].objects.items(), key=str)
            if selector.matches(o)
        ]
        rv = str(store.rv)
    start = 0
    if rec.query.get("continue"):
        try:
            token = json.loads(base64.urlsafe_b64decode(rec.query["continue"]))
            start, rv = int(token["start"]), token["rv"]
        except (ValueError, KeyError, TypeError):
            return 400, status_body(400, message="invalid continue token")
    meta: dict[str, Any] = {"resourceVersion": rv}
    limit = int(rec.query.get("limit") or 0)
    if limit > 0 and start + limit < len(items):
        token = json.dumps({"rv": rv, "start": start + limit}).encode()
        meta["continue"] = base64.urlsafe_b64encode(token).decode()
        meta["remainingItemCount"] = len(items) - start - limit
        items = items[start : start + limit]
    else:
        items = items[start:]
    return 200, {
        "kind": f"{kind}List",
        "apiVersion": api_version,
        "metadata": meta,
        "items": items,
    }


def write_object(store: Store, rec: RecordedRequest) -> tuple[int, Any]:
    """Answer get/create/update/delete on a single object.

    Create refuses an existing name (409), update needs the current
    resourceVersion (422 without one, 409 for a stale one), and both keep the
    server's uid, creationTimestamp, namespace and name.
    """
    resource = rec.resource
    with store.cond:
        collection = store.collections[resource]
        body = rec.body if isinstance(rec.body, dict) else None
        name = rec.name
        if rec.verb == "create":
            if body is None or not body.get("metadata", {}).get("name"):
                return 400, status_body(400, message="metadata.name is required")
            name = body["metadata"]["name"]
            if resource == "events":
                invalid = event_errors(body, rec.namespace)
                if invalid:
                    what = f'Event.events.k8s.io "{name}" is invalid: {invalid}'
                    return 422, status_body(422, "Invalid", what)
        key = store.key(resource, rec.namespace, name)
        what = f'{qualified_name(resource)} "{name}"'
        details = {"name": name, "group": RESOURCES[resource][2], "kind": resource}
        existing = collection.objects.get(key)
        if rec.verb == "create":
            if existing is not None:
                return 409, status_body(
                    409, "AlreadyExists", f"{what} already exists", details
                )
            body = copy.deepcopy(body)
            body["metadata"].pop("resourceVersion", None)
            body["metadata"].pop("uid", None)
            if rec.namespace is not None:
                body["metadata"]["namespace"] = rec.namespace
            return 201, store.add(resource, body)
        if existing is None:
            return 404, status_body(404, "NotFound", f"{what} not found", details)
        if rec.verb == "get":
            return 200, copy.deepcopy(existing)
        if rec.verb == "delete":
            store.commit(resource, "DELETED", copy.deepcopy(existing), existing)
            ok = status_body(200, "", "", details)
            ok.update(status="Success", code=200)
            return 200, ok
        # update
        if body is None:
            return 400, status_body(400, message="request body is required")
        sent_rv = body.get("metadata", {}).get("resourceVersion")
        if not sent_rv:
            msg = f"{what} is invalid: metadata.resourceVersion: must be specified"
            return 422, status_body(422, "Invalid", msg, details)
        if str(sent_rv) != existing["metadata"]["resourceVersion"]:
            return 409, conflict(name, resource).body()
        new = copy.deepcopy(body)
        for keep in ("uid", "creationTimestamp", "namespace", "name"):
            if keep in existing["metadata"]:
                new["metadata"][keep] = existing["metadata"][keep]
        return 200, store.commit(resource, "MODIFIED", new, existing)


# What the API server's validation of events.k8s.io/v1 Events requires of a new one.
EVENT_REQUIRED = ("eventTime", "reportingController", "reportingInstance", "action")
EVENT_NOTE_MAX_BYTES = 1024
# An object name: a DNS-1123 subdomain of at most 253 characters.
NAME_MAX_LENGTH = 253
DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


def event_errors(body: dict[str, Any], namespace: str | None) -> str:
    """Why the API server would refuse to create this Event ("" when it would not)."""
    errors = [
        f"{field}: Required value" for field in EVENT_REQUIRED if not body.get(field)
    ]
    name = str(body.get("metadata", {}).get("name", ""))
    if len(name) > NAME_MAX_LENGTH:
        errors.append(
            f"metadata.name: Invalid value: must be no more than {NAME_MAX_LENGTH} "
            "characters"
        )
    elif not DNS_SUBDOMAIN.fullmatch(name):
        errors.append(
            "metadata.name: Invalid value: a lowercase RFC 1123 subdomain must "
            "consist of lower case alphanumeric characters, '-' or '.'"
        )
    if body.get("type") not in ("Normal", "Warning"):
        errors.append("type: Unsupported value")
    if not body.get("reason") or len(body["reason"]) > 128:
        errors.append("reason: Invalid value")
    if len(str(body.get("note", "")).encode()) > EVENT_NOTE_MAX_BYTES:
        errors.append(
            f"note: Too long: may not be more than {EVENT_NOTE_MAX_BYTES} bytes"
        )
    regarding = body.get("regarding") or {}
    if regarding.get("namespace") != namespace:
        errors.append("regarding.namespace: does not match event.namespace")
    return ", ".join(errors)
