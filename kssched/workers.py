"""The gunicorn worker of both listeners: gevent, with a deadline per connection.

gunicorn's gevent worker serves each connection in its own greenlet, so a client
that stalls holds a greenlet, not the worker. `DeadlineWorker` adds a deadline: the
TLS handshake (see `ssl_context` in gunicorn_conf.py), the request head and the
whole body must arrive within the listener's read timeout, counted from accept
(`KSSCHED_EXTENDER_READ_TIMEOUT`, `KSSCHED_WEB_READ_TIMEOUT`). The body is read
before the application runs, so the application never waits for a client. Past
the deadline the connection is closed (on the extender listener after a `408`) and
counted in `kssched_connections_dropped_total`.

On the extender listener, the answers the worker gives itself (`400`/`414`/`431`
for a malformed head, `408`) are short JSON `{"Error": ...}` bodies, since
kube-scheduler logs whatever it receives, each counted in
`kssched_extender_errors_total`.
"""

import io
import json
import logging
import ssl
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any

import gevent
from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

from kssched import config

# The body is read in pieces of this size; one over the largest accepted body is
# drained (within the deadline) so that the client reads the `413` it is answered.
_READ_SIZE = 64 * 1024

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
Application = Callable[[Environ, StartResponse], Iterable[bytes]]

# The deadline of the connection the current greenlet serves.
_deadline: ContextVar[gevent.Timeout | None] = ContextVar("deadline", default=None)


class ReadTimeout(Exception):
    """The request (or its TLS handshake) did not arrive within the read timeout."""

    def __str__(self) -> str:
        return "request not received within the read timeout"


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
        deadline = gevent.Timeout(self.read_timeout, ReadTimeout)
        token = _deadline.set(deadline)
        deadline.start()
        try:
            super().handle(listener, client, addr)
        finally:
            deadline.close()
            _deadline.reset(token)

    def reading_first(self, application: Application) -> Application:
        """`application`, called once the whole body has been read within the
        deadline; the deadline ends there."""

        def read_then_call(environ: Environ, start_response: StartResponse) -> Any:
            stream = environ["wsgi.input"]
            body = stream.read(self.body_limit + 1)
            if len(body) > self.body_limit:
                while stream.read(_READ_SIZE):
                    pass
            environ["wsgi.input"] = io.BytesIO(body)
            # A chunked body, now with its length (Django reads only that much).
            environ.setdefault("CONTENT_LENGTH", str(len(body)))
            deadline = _deadline.get()
            if deadline is not None:
                deadline.close()
            return application(environ, start_response)

        return read_then_call

    def handle_error(
        self, req: Any, client: Any, addr: Any, exc: BaseException
    ) -> None:
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
        # gunicorn's answer (status and reason), sent as JSON.
        captured = _Captured(client)
        super().handle_error(req, captured, addr, exc)
        status, _, reason = captured.status_line().partition(" ")
        code = int(status) if status.isdigit() else 500
        _quietly("count_extender_error", path, _GUNICORN_REASONS.get(code, "exception"))
        _send(client, code, reason, str(exc) if code < 500 else "")


# gunicorn's own answers, as reasons of kssched_extender_errors_total.
_GUNICORN_REASONS = {
    400: "bad_request",
    403: "forbidden",
    414: "uri_too_long",
    417: "expectation_failed",
    431: "header_fields_too_large",
    501: "not_implemented",
}


class _Captured:
    """A client socket that keeps what gunicorn writes to it instead of sending it;
    everything else goes to the socket."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data

    def gettimeout(self) -> float:
        return 0.0

    def status_line(self) -> str:
        """`500 Internal Server Error`, from `HTTP/1.1 500 Internal Server Error`."""
        line = self.data.split(b"\r\n", 1)[0].decode("latin-1")
        return line.partition(" ")[2] or "500 Internal Server Error"

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
    # What the client sent past what was read would make a plain close a reset,
    # which may cut the answer short.
    util.close_graceful(client)


def _quietly(counter: str, *labels: str | None) -> None:
    """Count with `kssched.metrics.<counter>`, never failing the caller (imported
    here: the master loads this module, and no metric may be made before a fork)."""
    try:
        from kssched import metrics

        getattr(metrics, counter)(*labels)
    except Exception:
        logging.getLogger("kssched.workers").exception("Could not count %s", labels)
