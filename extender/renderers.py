"""Response rendering for the extender and the version endpoint."""

import orjson
from rest_framework.renderers import BaseRenderer


class ORJSONRenderer(BaseRenderer):
    """Render JSON with orjson: compact, UTF-8, ints stay ints."""

    media_type = "application/json"
    format = "json"
    charset = None

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        return orjson.dumps(data)


class PlainTextRenderer(BaseRenderer):
    """Render a string as one line of plain text."""

    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return f"{data}\n".encode()
