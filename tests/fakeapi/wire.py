"""Status bodies and watch events as the API server puts them on the wire."""

from __future__ import annotations

import json
from typing import Any

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(
    code: int,
    reason: str | None = None,
    message: str | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return a ``Status`` object as the API server sends it for failures."""
    reason = reason or REASONS.get(code, "Unknown")
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message or reason,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def event(type_: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Return one watch event ``{"type": ..., "object": ...}``."""
    return {"type": type_, "object": obj}


def bookmark(rv: str | int, kind: str = "Pod", api_version: str = "v1") -> dict:
    """Return a BOOKMARK event that carries only the resourceVersion."""
    obj = {"kind": kind, "apiVersion": api_version}
    obj["metadata"] = {"resourceVersion": str(rv)}
    return event("BOOKMARK", obj)


def expired(requested: str | int = "1", oldest: str | int = "100") -> dict:
    """Return the 410 ERROR event sent for a compacted resourceVersion."""
    msg = f"too old resource version: {requested} ({oldest})"
    return event("ERROR", status_body(410, "Expired", msg))


def encode_event(ev: dict[str, Any]) -> bytes:
    """Encode one event as the API server does: a JSON object and a newline."""
    return json.dumps(ev, separators=(",", ":")).encode() + b"\n"
