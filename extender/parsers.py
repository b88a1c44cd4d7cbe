"""Request parsing for the extender: orjson, with an explicit body-size limit."""

import orjson
from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import BaseParser


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
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ParseError(f"malformed JSON: {exc}") from None
