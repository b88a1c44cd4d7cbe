"""The worker of both listeners: gunicorn's gevent worker, with a deadline.

Each connection has its own greenlet, so a stalled client holds a greenlet, not the
worker. Its TLS handshake, request head and whole body must arrive within the
listener's read timeout from accept (`KSSCHED_EXTENDER_READ_TIMEOUT`,
`KSSCHED_WEB_READ_TIMEOUT`); the application runs only after that. Past it the
connection is closed and counted in `kssched_connections_dropped_total`. On the
extender listener the worker's own answers (`400`, `414`, `431`, `408`, ...) are
JSON `{"Error": ...}` bodies, counted in `kssched_extender_errors_total`.
"""

import io
import json
import ssl
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any

import gevent
from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

from kssched import config

# A body over the limit is drained (in pieces of this size) so the client reads 413.
_READ_SIZE = 64 * 1024

Application = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
# The deadline of the connection the current greenlet serves.
_deadline: ContextVar[gevent.Timeout | None] = ContextVar("deadline", default=None)


class ReadTimeout(Exception):
    """The request (or its TLS handshake) did not arrive within the read timeout."""


class DeadlineWorker(GeventWorker):  # type: ignore[misc]
    """gunicorn's gevent worker, reading each request within a deadline."""

    def init_process(self) -> None:
        settings = config.load()
        self.listener_name: str = settings.listener
        self.read_timeout: float = settings.read_timeout
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        from django.conf import settings

        # The largest body read before the application, which judges its size.
        self.body_limit: int = max(
            settings.KSSCHED_MAX_BODY_BYTES, settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0
        )
        loaded: Application = vars(self)["wsgi"]
        self.wsgi = self.reading_first(loaded)

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        why = ReadTimeout(f"request not received within {self.read_timeout:g} s")
        deadline = gevent.Timeout(self.read_timeout, why)
        token = _deadline.set(deadline)
        deadline.start()
        try:
            super().handle(listener, client, addr)
        finally:
            deadline.close()
            _deadline.reset(token)

    def reading_first(self, application: Application) -> Application:
        """`application`, run once the body is read: the deadline ends there."""

        def read_then_call(environ: dict[str, Any], start_response: Any) -> Any:
            stream = environ["wsgi.input"]
            body = stream.read(self.body_limit + 1)
            if len(body) > self.body_limit:
                while stream.read(_READ_SIZE):
                    pass
            environ["wsgi.input"] = io.BytesIO(body)
            # A chunked body, now with its length (Django reads only that much).
            environ.setdefault("CONTENT_LENGTH", str(len(body)))
            if (deadline := _deadline.get()) is not None:
                deadline.close()
            return application(environ, start_response)

        return read_then_call

    def handle_error(
        self, req: Any, client: Any, addr: Any, exc: BaseException
    ) -> None:
        if (deadline := _deadline.get()) is not None:
            deadline.close()
        path = getattr(req, "path", None)
        if isinstance(exc, ReadTimeout):
            _quietly("count_dropped_connection", self.listener_name, "read_timeout")
            if self.listener_name == "extender":
                _quietly("count_extender_error", path, "read_timeout")
                _send(client, 408, "Request Timeout", str(exc))
            return
        if isinstance(exc, ssl.SSLError) and req is None:
            # A failed handshake (no client certificate, not TLS at all).
            _quietly("count_dropped_connection", self.listener_name, "tls_handshake")
            return
        if self.listener_name != "extender":
            super().handle_error(req, client, addr, exc)
            util.close_graceful(client)
            return
        # gunicorn's answer (its status line), sent as JSON.
        captured = _Captured(client)
        super().handle_error(req, captured, addr, exc)
        line = captured.data.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        status, reason = line[1:] if len(line) == 3 else ("500", "Server Error")
        code = int(status) if status.isdigit() else 500
        _quietly("count_extender_error", path, "exception" if code >= 500 else code)
        _send(client, code, reason, str(exc) if code < 500 else "")


class _Captured:
    """A client socket that keeps what gunicorn sends to it."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _send(client: Any, status: int, reason: str, message: str) -> None:
    """An answer with a short JSON body: `{"Error": "..."}`; never fails."""
    text = f"{reason}: {message}" if message else reason
    body = json.dumps({"Error": text}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    try:
        client.sendall(head.encode("latin-1") + body)
    except OSError:
        pass
    util.close_graceful(client)  # a plain close with unread bytes would reset


def _quietly(counter: str, *labels: str | int | None) -> None:
    """`kssched.metrics.<counter>(*labels)`, which never fails (imported here: the
    master loads this module, and must make no metric before it forks)."""
    from kssched import metrics

    getattr(metrics, counter)(*labels)
