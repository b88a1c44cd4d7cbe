"""A WSGI application whose every answer fails to close, for the serving worker's
test: the worker logs the failure and goes on serving (`test_listeners`)."""

from collections.abc import Callable
from typing import Any


class _Answer(list[bytes]):
    def close(self) -> None:
        raise RuntimeError("this answer cannot be closed")


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return _Answer([b"answered"])
