"""Request parsing for the extender: orjson, with explicit limits.

Two limits keep one request from exhausting a worker: the body size
(`KSSCHED_MAX_BODY_BYTES`), and the memory the decoded body would take, estimated
from the body before it is decoded (`estimate_decoded_bytes`). Chunked bodies
(no Content-Length) are read up to the same size limit.
"""

import gc
import io
from collections.abc import Mapping
from typing import IO, Any

import orjson
from django.conf import settings
from django.core.signals import request_started
from django.http import HttpRequest
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import BaseParser

# Bodies below this decode into too few objects for a collection to matter.
_GC_PAUSE_BYTES = 256 * 1024


# Decoded Python objects take several times the bytes of their JSON; a body may
# decode to at most this many times the body limit (see `estimate_decoded_bytes`).
DECODED_BYTES_PER_BODY_BYTE = 8

# Bytes read at a time from a chunked body.
_CHUNKED_READ = 64 * 1024


class RequestTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"


class BodyNotReceived(APIException):
    """The body did not arrive within the read timeout, or the client went away."""

    status_code = status.HTTP_408_REQUEST_TIMEOUT
    default_code = "read_timeout"


def estimate_decoded_bytes(body: bytes) -> int:
    """An upper estimate of the memory `orjson.loads(body)` would take, in bytes.

    Counted in C over the raw bytes (about 0.1 s for 128 MiB), so a body is judged
    before anything is decoded. Per JSON value, CPython needs: a dict up to 184 bytes
    (a small one; 64 when empty), a list 56, a string 49 plus its text, an int 28,
    and 8 for the slot that holds each of them. Every `{` or `[` is counted as a
    184-byte container, every quote pair as a 64-byte string, every comma as a
    40-byte element, plus the body itself for the text. Braces or commas inside
    strings only make the estimate larger. Measured on real Node lists the estimate
    is 1.4-1.9 times the memory actually taken; on `[{},{},...]` (2.5 bytes per
    object, the worst shape) 1.5 times.
    """
    containers = body.count(b"{") + body.count(b"[")
    strings = body.count(b'"') // 2
    elements = body.count(b",")
    return 184 * containers + 64 * strings + 40 * elements + len(body)


def max_decoded_bytes(body_limit: int) -> int:
    """The decoded-size budget that goes with a body limit."""
    return DECODED_BYTES_PER_BODY_BYTE * body_limit


def read_unsized_body(request: HttpRequest, limit: int | None) -> None:
    """Read a chunked request body (no Content-Length) up to `limit` bytes.

    Django reads only Content-Length bytes from a request, so it sees a chunked body
    as empty. gunicorn decodes the chunks in `wsgi.input`: this reads them there and
    hands the body to Django as if it had come with its length. Over the limit, it
    stops reading and raises RequestTooLarge (413).
    """
    meta = request.META
    if meta.get("CONTENT_LENGTH"):
        return
    if "chunked" not in meta.get("HTTP_TRANSFER_ENCODING", "").lower():
        return
    stream = meta["wsgi.input"]
    pieces = []
    size = 0
    try:
        while True:
            want = _CHUNKED_READ if limit is None else min(_CHUNKED_READ, limit + 1)
            piece = stream.read(want)
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
            if limit is not None and size > limit:
                raise RequestTooLarge(
                    f"chunked request body is over the limit of {limit} bytes"
                )
    except OSError as exc:
        raise BodyNotReceived(
            f"request body was not received completely: {exc}"
        ) from None
    body = b"".join(pieces)
    meta["CONTENT_LENGTH"] = str(len(body))
    # What Django itself does once it has read a body (HttpRequest.body).
    request._stream = io.BytesIO(body)


class ORJSONParser(BaseParser):
    """Parse a JSON body with orjson.

    The limit is the view's `max_body_bytes` (the extender routes accept full Node
    lists) or Django's DATA_UPLOAD_MAX_MEMORY_SIZE everywhere else. It is checked
    against Content-Length before anything is read, and again on what was read.
    """

    media_type = "application/json"

    # Any JSON value (a list too): the stub's Mapping is narrower than DRF's parsers.
    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        parser_context = parser_context or {}
        view = parser_context.get("view")
        limit = getattr(view, "max_body_bytes", None)
        if limit is None:
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        request = parser_context.get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if limit is not None and declared and int(declared) > limit:
            raise RequestTooLarge(
                f"request body of {declared} bytes is over the limit of {limit} bytes"
            )
        try:
            body = stream.read() if limit is None else stream.read(limit + 1)
        except OSError as exc:
            raise BodyNotReceived(
                f"request body was not received completely: {exc}"
            ) from None
        if limit is not None and len(body) > limit:
            raise RequestTooLarge(f"request body is over the limit of {limit} bytes")
        if limit is not None and len(body) >= _GC_PAUSE_BYTES:
            check_decoded_size(body, limit)
        try:
            return parse_json(body)
        except orjson.JSONDecodeError as exc:
            raise ParseError(f"malformed JSON: {exc}") from None


def check_decoded_size(body: bytes, limit: int) -> None:
    """Raise RequestTooLarge (413) when `body` would decode to more memory than a
    body of `limit` bytes is allowed (`max_decoded_bytes`)."""
    estimate = estimate_decoded_bytes(body)
    budget = max_decoded_bytes(limit)
    if estimate > budget:
        raise RequestTooLarge(
            f"request body of {len(body)} bytes would take about "
            f"{estimate // 2**20} MiB once decoded, over the limit of "
            f"{budget // 2**20} MiB: it holds {estimate // max(len(body), 1)} times "
            "its size in JSON values, far denser than any Node list"
        )


def parse_json(body: bytes) -> Any:
    """orjson.loads, with the cyclic garbage collector paused for large bodies.

    Decoding 1000 full Node objects creates about a million objects. With the
    collector on, every 700 of them start a collection that walks all the young
    ones, and moving them to older generations walks them again: in a Django worker
    the parse took 210 ms instead of 40 ms, and collections after it cost as much
    again. Decoded JSON holds no reference cycles, so the collector finds nothing
    in it: it stays paused until the next request starts (`resume_gc`). By then the
    body is freed, and freeing tracked objects brings the collector's allocation
    count back down, so nothing is walked later either.
    """
    global _gc_paused
    if len(body) >= _GC_PAUSE_BYTES and gc.isenabled():
        gc.disable()
        _gc_paused = True
    return orjson.loads(body)


def resume_gc(**kwargs: Any) -> None:
    """Turn the collector back on if `parse_json` paused it (request_started)."""
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.enable()


_gc_paused = False
request_started.connect(resume_gc, dispatch_uid="extender.parsers.resume_gc")
