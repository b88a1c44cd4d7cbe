"""gunicorn's gevent worker with a read deadline: a connection's TLS handshake, head
and body must arrive within the listener's read timeout (a kept-alive connection's
next head within `keepalive`, its body within the read timeout). Requests read whole
run in `threads` application greenlets, which keep their database connections."""

import contextlib
import io
import json
import ssl
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import gevent.event
import gevent.queue
from django.conf import settings
from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

from kssched import config

# A request read whole: the WSGI call's arguments, and where its answer goes.
Job = tuple[dict[str, Any], Any, "gevent.event.AsyncResult[list[bytes]]"]
# The deadline of the connection this greenlet serves, raised as itself when due.
_deadline: ContextVar[gevent.Timeout] = ContextVar("deadline")
# Each connection greenlet's latest wait for a next request (one worker a process).
_idle: weakref.WeakKeyDictionary[Any, gevent.Timeout] = weakref.WeakKeyDictionary()


class DeadlineWorker(GeventWorker):  # type: ignore[misc]
    """gunicorn's gevent worker, reading each request within a deadline."""

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.listener_name: str = config.load().listener
        self.read_timeout: float = config.load().read_timeout
        # The largest body read before the application, which judges its size.
        uploads = settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0
        self.body_limit: int = max(settings.KSSCHED_MAX_BODY_BYTES, uploads)
        self.application: Callable[..., Iterable[bytes]] = vars(self)["wsgi"]
        self.jobs: gevent.queue.Queue[Job] = gevent.queue.Queue()
        for _ in range(self.cfg.threads):
            gevent.spawn(self.run_jobs)
        self.wsgi = self.read_then_call

    def run_jobs(self) -> None:
        """An application greenlet: runs requests in turn, closes answers once sent."""
        while True:
            environ, start_response, answered = self.jobs.get()
            try:
                answer = self.application(environ, start_response)
                answered.set([b"".join(answer)])
                gevent.sleep(0)
                if hasattr(answer, "close"):
                    answer.close()
            except BaseException as exc:  # this greenlet outlives any answer
                if answered.ready():
                    self.log.exception("Error closing an answer")
                else:  # raised in the connection's greenlet
                    answered.set_exception(exc)

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        with gevent.Timeout.start_new(self.read_timeout) as deadline:
            _deadline.set(deadline)  # each greenlet has a context of its own
            super().handle(listener, client, addr)

    @contextlib.contextmanager
    def timeout_ctx(self) -> Iterator[None]:
        """The wait for a kept-alive connection's next head: `keepalive` seconds, none
        once the worker stops (the client reconnects); a first head has the deadline."""
        first = _deadline.get().pending
        seconds = self.cfg.keepalive if self.alive or first else 0
        with gevent.Timeout(seconds, False) as wait:  # type: ignore[arg-type]
            if not first:
                _idle[gevent.getcurrent()] = wait
            yield

    def handle_exit(self, sig: int, frame: Any) -> None:
        """Stop: connections waiting for a next request are closed at once."""
        super().handle_exit(sig, frame)
        for greenlet, wait in list(_idle.items()):  # thrown in from the hub
            gevent.get_hub().loop.run_callback(_end_wait, greenlet, wait)

    def read_then_call(self, environ: dict[str, Any], start_response: Any) -> Any:
        """The application's answer, once the body is read within the deadline."""
        if not (deadline := _deadline.get()).pending:  # a next request, kept alive
            _deadline.set(deadline := gevent.Timeout.start_new(self.read_timeout))
        with deadline:
            stream = environ["wsgi.input"]
            body = stream.read(self.body_limit + 1)
            while len(body) > self.body_limit and stream.read(65536):
                pass  # drained, so that the client reads its 413
        environ["wsgi.input"] = io.BytesIO(body)
        answered: gevent.event.AsyncResult[list[bytes]] = gevent.event.AsyncResult()
        self.jobs.put((environ, start_response, answered))
        return answered.get()

    def handle_error(self, req: Any, sock: Any, addr: Any, exc: BaseException) -> None:
        from kssched import metrics  # no metric is made in the master

        (deadline := _deadline.get()).close()
        path, extender = getattr(req, "path", None), self.listener_name == "extender"
        if exc is deadline or (isinstance(exc, ssl.SSLError) and not req):
            reason = "read_timeout" if exc is deadline else "tls_handshake"
            metrics.count_dropped_connection(self.listener_name, reason)
            if extender and reason == "read_timeout":
                metrics.count_extender_error(path, "read_timeout")
                why = f"request not received within {self.read_timeout:g} s"
                _send(sock, 408, "Request Timeout", why)
            return
        # gunicorn's answer; on the extender listener, its status line sent as JSON.
        captured = _Captured(sock) if extender else sock
        super().handle_error(req, captured, addr, exc)
        if not extender:
            util.close_graceful(sock)
            return
        head = captured.getvalue().split(b"\r\n", 1)[0].decode("latin-1")
        _, status, reason = (head or "HTTP/1.1 500 Server Error").split(" ", 2)
        code = int(status)
        metrics.count_extender_error(path, "exception" if code >= 500 else code)
        _send(sock, code, reason, str(exc) if code < 500 else "")


def _end_wait(greenlet: Any, wait: gevent.Timeout) -> None:
    if wait.pending:  # the greenlet is still in the wait
        greenlet.throw(wait)


class _Captured(io.BytesIO):
    """A client socket that keeps what gunicorn sends to it."""

    def __init__(self, client: Any) -> None:
        super().__init__()
        self.client = client

    sendall = io.BytesIO.write

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def _send(client: Any, status: int, reason: str, message: str) -> None:
    """An answer with a short JSON body, `{"Error": "..."}`; never fails."""
    body = json.dumps({"Error": f"{reason}: {message}" if message else reason})
    head = f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    with contextlib.suppress(OSError):
        client.sendall((head + body).encode("latin-1"))
    util.close_graceful(client)  # a plain close with unread bytes would reset
