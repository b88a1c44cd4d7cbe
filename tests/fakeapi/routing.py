"""Which resource, object and verb a request is for, and the record kept of it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakeapi.objects import RESOURCES


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    verb: str | None
    resource: str | None
    namespace: str | None
    name: str | None
    body: Any
    at: float

    @property
    def is_watch(self) -> bool:
        return self.verb == "watch"


def parse_request(method: str, target: str, raw_body: bytes) -> RecordedRequest:
    """Return the record of one request; the body is JSON when it parses, else bytes."""
    parts = urlsplit(target)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    try:
        body = json.loads(raw_body) if raw_body else None
    except ValueError:
        body = raw_body
    resource, namespace, name = route(parts.path)
    verb = request_verb(method, name, query) if resource else None
    return RecordedRequest(
        method,
        parts.path,
        query,
        verb,
        resource,
        namespace,
        name,
        body,
        time.monotonic(),
    )


def route(path: str) -> tuple[str | None, str | None, str | None]:
    """Map a URL path to (resource, namespace, name)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif parts[:3] in (
        ["apis", "coordination.k8s.io", "v1"],
        ["apis", "events.k8s.io", "v1"],
    ):
        rest = parts[3:]
    else:
        return None, None, None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 2:
        return None, None, None
    resource = rest[0]
    allowed = {
        "api": {"pods", "nodes"},
        "coordination.k8s.io": {"leases"},
        "events.k8s.io": {"events"},
    }[parts[0] if parts[0] == "api" else parts[1]]
    if resource not in allowed:
        return None, None, None
    if namespace is not None and not RESOURCES[resource][3]:
        return None, None, None
    return resource, namespace, rest[1] if len(rest) == 2 else None


def request_verb(method: str, name: str | None, query: dict[str, str]) -> str | None:
    """Return the API verb (list, watch, get, create, update, delete) or None."""
    if method == "GET":
        if name is not None:
            return "get"
        return "watch" if query.get("watch") in ("true", "1") else "list"
    if method == "POST" and name is None:
        return "create"
    if method == "PUT" and name is not None:
        return "update"
    if method == "DELETE" and name is not None:
        return "delete"
    return None
