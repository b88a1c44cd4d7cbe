"""Request parsing for the extender: orjson, with an explicit body-size limit."""

import gc

import orjson
from django.conf import settings
from django.core.signals import request_started
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import BaseParser

# Bodies below this decode into too few objects for a collection to matter.
_GC_PAUSE_BYTES = 256 * 1024


class RequestTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"


class ORJSONParser(BaseParser):
    """Parse a JSON body with orjson.

    The limit is the view's `max_body_bytes` (the extender routes accept full Node
    lists) or Django's DATA_UPLOAD_MAX_MEMORY_SIZE everywhere else. It is checked
    against Content-Length before anything is read, and again on what was read.
    """

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
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
        body = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(body) > limit:
            raise RequestTooLarge(f"request body is over the limit of {limit} bytes")
        try:
            return parse_json(body)
        except orjson.JSONDecodeError as exc:
            raise ParseError(f"malformed JSON: {exc}") from None


def parse_json(body: bytes):
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


def resume_gc(**kwargs):
    """Turn the collector back on if `parse_json` paused it (request_started)."""
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.enable()


_gc_paused = False
request_started.connect(resume_gc, dispatch_uid="extender.parsers.resume_gc")
