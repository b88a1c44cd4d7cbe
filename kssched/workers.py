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
from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

from kssched import config

Jobs = gevent.queue.Queue[Callable[[], object]]
# The deadline of the connection the current greenlet serves.
_deadline: ContextVar[gevent.Timeout | None] = ContextVar("deadline", default=None)


class ReadTimeout(Exception):
    """The request (or its TLS handshake) did not arrive within the read timeout."""


class DeadlineWorker(GeventWorker):  # type: ignore[misc]
    """gunicorn's gevent worker, reading each request within a deadline."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Each connection's greenlet and its latest wait for a next request.
        self.idle: weakref.WeakKeyDictionary[Any, gevent.Timeout] = (
            weakref.WeakKeyDictionary()
        )

    def load_wsgi(self) -> None:
        super().load_wsgi()
        from django.conf import settings

        self.listener_name: str = config.load().listener
        self.read_timeout: float = config.load().read_timeout
        # The largest body read before the application, which judges its size.
        self.body_limit: int = max(
            settings.KSSCHED_MAX_BODY_BYTES, settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0
        )
        self.application: Callable[..., Iterable[bytes]] = vars(self)["wsgi"]
        self.jobs: Jobs = gevent.queue.Queue()
        for _ in range(self.cfg.threads):
            gevent.spawn(self.run_jobs)
        self.wsgi = self.read_then_call

    def run_jobs(self) -> None:
        """The application greenlet: runs requests and closes answers in turn."""
        while True:
            try:
                self.jobs.get()()
            except Exception:  # this greenlet must outlive any answer's close
                self.log.exception("Error in the application greenlet")

    def deadline(self) -> gevent.Timeout:
        why = ReadTimeout(f"request not received within {self.read_timeout:g} s")
        return gevent.Timeout.start_new(self.read_timeout, why)

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        with self.deadline() as deadline:  # each greenlet has a context of its own
            _deadline.set(deadline)
            super().handle(listener, client, addr)

    @contextlib.contextmanager
    def timeout_ctx(self) -> Iterator[None]:
        """The wait for a kept-alive connection's next request head: `keepalive`
        seconds at most, none once the worker stops (the client reconnects); a
        connection's first request has its deadline."""
        first = (deadline := _deadline.get()) is not None and deadline.pending
        seconds = self.cfg.keepalive if self.alive or first else 0
        with gevent.Timeout(seconds, False) as wait:  # type: ignore[arg-type]
            if not first:
                self.idle[gevent.getcurrent()] = wait
            yield

    def handle_exit(self, sig: int, frame: Any) -> None:
        """Stop: connections waiting for a next request are closed at once (the
        wait is thrown from the hub, into greenlets still in it)."""
        super().handle_exit(sig, frame)
        for greenlet, wait in list(self.idle.items()):
            gevent.get_hub().loop.run_callback(_end_wait, greenlet, wait)

    def read_then_call(self, environ: dict[str, Any], start_response: Any) -> Any:
        """The application's answer, once the body is read within the deadline."""
        if (deadline := _deadline.get()) is None or not deadline.pending:
            _deadline.set(deadline := self.deadline())  # a kept-alive connection
        with deadline:
            stream = environ["wsgi.input"]
            body = stream.read(self.body_limit + 1)
            while len(body) > self.body_limit and stream.read(65536):
                pass  # drained, so that the client reads its 413
        environ["wsgi.input"] = io.BytesIO(body)
        answered: gevent.event.AsyncResult[_Sent] = gevent.event.AsyncResult()

        def call() -> None:
            try:
                answer = self.application(environ, start_response)
                answered.set(_Sent(answer, self.jobs))
            except BaseException as exc:  # raised in the connection's greenlet
                answered.set_exception(exc)

        self.jobs.put(call)
        return answered.get()

    def handle_error(
        self, req: Any, client: Any, addr: Any, exc: BaseException
    ) -> None:
        from kssched import metrics  # no metric is made in the master

        if (deadline := _deadline.get()) is not None:
            deadline.close()
        path, extender = getattr(req, "path", None), self.listener_name == "extender"
        if isinstance(exc, ReadTimeout) or (isinstance(exc, ssl.SSLError) and not req):
            reason = "read_timeout" if isinstance(exc, ReadTimeout) else "tls_handshake"
            metrics.count_dropped_connection(self.listener_name, reason)
            if extender and reason == "read_timeout":
                metrics.count_extender_error(path, "read_timeout")
                _send(client, 408, "Request Timeout", str(exc))
            return
        if not extender:
            super().handle_error(req, client, addr, exc)
            util.close_graceful(client)
            return
        # gunicorn's answer (its status line), sent as JSON.
        captured = _Captured(client)
        super().handle_error(req, captured, addr, exc)
        line = captured.data.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        status, reason = line[1:] if len(line) == 3 else ("500", "Server Error")
        code = int(status) if status.isdigit() else 500
        metrics.count_extender_error(path, "exception" if code >= 500 else code)
        _send(client, code, reason, str(exc) if code < 500 else "")


def _end_wait(greenlet: Any, wait: gevent.Timeout) -> None:
    if wait.pending:  # the greenlet is still in the wait
        greenlet.throw(wait)


class _Sent(list[bytes]):
    """An answer's body; once sent, the application greenlet closes the answer."""

    def __init__(self, answer: Iterable[bytes], jobs: Jobs) -> None:
        super().__init__([b"".join(answer)])
        self.answer, self.jobs = answer, jobs

    def close(self) -> None:
        if hasattr(self.answer, "close"):
            self.jobs.put(self.answer.close)


class _Captured:
    """A client socket that keeps what gunicorn sends to it."""

    def __init__(self, client: Any) -> None:
        self._client, self.data = client, b""

    def sendall(self, data: bytes) -> None:
        self.data += data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _send(client: Any, status: int, reason: str, message: str) -> None:
    """An answer with a short JSON body, `{"Error": "..."}`; never fails."""
    body = json.dumps({"Error": f"{reason}: {message}" if message else reason})
    head = f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    with contextlib.suppress(OSError):
        client.sendall((head + body).encode("latin-1"))
    util.close_graceful(client)  # a plain close with unread bytes would reset
