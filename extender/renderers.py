"""Response rendering for the extender and the version endpoint."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

from extender.wire import HostPriorityList


class ORJSONRenderer(BaseRenderer):
    """Render JSON with orjson: compact, UTF-8, ints stay ints."""

    media_type = "application/json"
    format = "json"
    charset = None

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        if data is None:
            return b""
        if isinstance(data, HostPriorityList):
            return data.to_json()
        return orjson.dumps(data)


class PlainTextRenderer(BaseRenderer):
    """Render a string as one line of plain text."""

    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        return f"{data}\n".encode()


class ExtenderContentNegotiation(DefaultContentNegotiation):
    """Answer the extender routes in their one format, whatever Accept says.

    kube-scheduler sends no Accept header and reads only JSON; parsing Accept on
    every call cost about a fifth of the fixed time of a request. The body must be
    declared as JSON: kube-scheduler always sends `Content-Type: application/json`.
    """

    # DRF passes a list of renderers (the stub says any Iterable).
    def select_renderer(  # type: ignore[override]
        self,
        request: Request,
        renderers: Sequence[BaseRenderer],
        format_suffix: str | None = None,
    ) -> tuple[BaseRenderer, str]:
        renderer = renderers[0]
        return renderer, renderer.media_type

    def select_parser(
        self, request: Request, parsers: Iterable[BaseParser]
    ) -> BaseParser | None:
        """The parser whose media type is the request's Content-Type, or None (415).

        Parameters (`; charset=utf-8`) and letter case do not matter, but wildcards
        do not match: DRF's own matching would accept `*/*` or `application/*`,
        which declare nothing about the body.
        """
        content_type = request.content_type
        for parser in parsers:
            if content_type == parser.media_type:
                return parser
        media_type = content_type.partition(";")[0].strip().lower()
        for parser in parsers:
            if media_type == parser.media_type:
                return parser
        return None
