"""gunicorn parts for the two listeners: the extender's worker, and the logger.

`ExtenderWorker` serves the scheduler-facing listener (`KSSCHED_EXTENDER_BIND`). A
plain sync worker reads a request with blocking calls and no deadline, so a client
that sends half a request line and stalls holds the worker until the worker timeout
(20 s): three such clients stalled kube-scheduler's calls for 20 s and more. This
worker instead reads every request head in its event loop, several connections at
once, and runs the application only for a connection whose head is complete; the
rest of the request (the body) must arrive before the same deadline. A connection
that has not sent its whole request within `KSSCHED_EXTENDER_READ_TIMEOUT` seconds of
being accepted is closed and counted as `read_timeout`. So a stalled client never
holds a worker while it has sent only part of its head, and at most the read timeout
while it stalls its body.

gunicorn's own error answers (400/414/431 for a malformed head, 500 when a request
outlives the worker timeout) are HTML; on this listener they are short JSON
`{"Error": ...}` bodies instead, since kube-scheduler logs whatever it receives, and
each one is counted in `kssched_extender_errors_total`.
"""

import errno
import fcntl
import json
import logging
import mmap
import os
import selectors
import socket
import struct
import tempfile
import time

from gunicorn import glogging, util
from gunicorn.http.errors import (
    ConfigurationProblem,
    InvalidResponseHeader,
    InvalidResponseHeaderName,
    NoMoreData,
    ParseException,
)
from gunicorn.workers.sync import SyncWorker

logger = logging.getLogger("kssched.workers")

# The head of a request is read in pieces of this size; a head that has not ended
# after HEAD_LIMIT bytes is handed to gunicorn, which answers 431 or 400 for it.
_READ_SIZE = 16 * 1024
HEAD_LIMIT = 64 * 1024

# One worker, the acceptor, watches the listener; the others (standbys) join it only
# once its current request has taken longer than STANDBY_AFTER seconds, and look at
# that every STANDBY_POLL seconds. kube-scheduler calls one at a time, so with every
# worker on the listener each call woke them all, and the ones that lost the accept
# took the CPU the call needed (see `ExtenderWorker`).
STANDBY_AFTER = 0.025
STANDBY_POLL = 0.025

# When the acceptor's current request started (monotonic seconds, 0 when it is idle),
# shared by the workers this gunicorn master forks: mapped before the fork.
_BUSY_SINCE = mmap.mmap(-1, 8)
_BUSY = struct.Struct("d")


class ReadTimeout(NoMoreData):
    """The request did not arrive completely within the read timeout.

    A NoMoreData to gunicorn (the connection is closed without a traceback) and an
    OSError to the application (the extender answers 408, see extender.parsers).
    """

    def __str__(self):
        return "request not received within the read timeout"


class DeadlineSocket:
    """A client socket whose reads end at a fixed deadline.

    Returns the bytes already read by the event loop (`buffered`) first, then reads
    from the socket with a timeout of what is left until `deadline`; after it, every
    read raises ReadTimeout. Writes and everything else go to the socket unchanged.
    """

    def __init__(self, sock: socket.socket, deadline: float, buffered: bytes):
        self._sock = sock
        self._deadline = deadline
        self._buffered = buffered

    def recv(self, size: int, *flags) -> bytes:
        if self._buffered:
            data, self._buffered = self._buffered[:size], self._buffered[size:]
            return data
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise ReadTimeout()
        self._sock.settimeout(remaining)
        try:
            return self._sock.recv(size, *flags)
        except TimeoutError:
            raise ReadTimeout() from None
        finally:
            self._sock.settimeout(None)

    def __getattr__(self, name):
        return getattr(self._sock, name)


class _Pending:
    """A connection whose request head is still arriving."""

    __slots__ = ("listener", "address", "deadline", "head")

    def __init__(self, listener, address, deadline: float):
        self.listener = listener
        self.address = address
        self.deadline = deadline
        self.head = b""


class ExtenderWorker(SyncWorker):
    """A sync worker that reads request heads in its event loop, with a deadline.

    Of the workers of one master, the one that holds a lock on a file (released by
    the kernel if it dies) is the acceptor and watches the listener; a standby
    watches it too only while the acceptor is busy with a request for longer than
    STANDBY_AFTER (a slow body, a slow database), so a call never waits behind
    another for long, and an idle standby is not woken by every connection.
    """

    def init_process(self):
        self.read_timeout = float(os.environ.get("KSSCHED_EXTENDER_READ_TIMEOUT", "2"))
        # gunicorn's error pages, as JSON for kube-scheduler (this process serves
        # only the extender listener).
        util.write_error = write_json_error
        super().init_process()

    def run(self):
        self.selector = selectors.DefaultSelector()
        self.pending: dict[socket.socket, _Pending] = {}
        for listener in self.sockets:
            listener.setblocking(False)
        self.selector.register(self.PIPE[0], selectors.EVENT_READ, "wakeup")
        self.listening = False
        self.acceptor = False
        self.role_lock = self._open_role_lock()
        try:
            while self.alive:
                self.notify()
                self._take_role()
                self._wait_and_serve()
                self._drop_expired()
                if not self.is_parent_alive():
                    break
        finally:
            for client in list(self.pending):
                self._forget(client)
                util.close(client)
            self.selector.close()

    def _open_role_lock(self):
        """This worker's own handle on the master's acceptor lock file, or None when
        the file cannot be made (then every worker watches the listener)."""
        try:
            return open(acceptor_lock_path(self.ppid), "a")  # noqa: SIM115 - held for the worker's life
        except OSError as exc:
            self.log.warning("No acceptor lock (%s): every worker accepts", exc)
            return None

    def _take_role(self):
        """Become the acceptor if the lock is free; watch the listener if acceptor,
        or if the acceptor has been busy for longer than STANDBY_AFTER."""
        if not self.acceptor:
            if self.role_lock is None:
                self.acceptor = True
            else:
                try:
                    fcntl.flock(self.role_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self.acceptor = True
                    _set_busy(0.0)
                except BlockingIOError:
                    pass
        listen = self.acceptor
        if not listen:
            since = _busy_since()
            listen = bool(since) and time.monotonic() - since > STANDBY_AFTER
        if listen != self.listening:
            for listener in self.sockets:
                if listen:
                    self.selector.register(listener, selectors.EVENT_READ, "listener")
                else:
                    self.selector.unregister(listener)
            self.listening = listen

    def handle(self, listener, client, addr):
        if self.acceptor and self.role_lock is not None:
            _set_busy(time.monotonic())
            try:
                super().handle(listener, client, addr)
            finally:
                _set_busy(0.0)
        else:
            super().handle(listener, client, addr)

    def _wait_and_serve(self):
        timeout = 1.0 if self.acceptor else STANDBY_POLL
        if self.pending:
            first = min(p.deadline for p in self.pending.values())
            timeout = max(0.0, min(timeout, first - time.monotonic()))
        try:
            events = self.selector.select(timeout)
        except InterruptedError:
            return
        for key, _ in events:
            if key.data == "wakeup":
                try:
                    os.read(self.PIPE[0], 1)
                except BlockingIOError:
                    pass
            elif key.data == "listener":
                self._accept_all(key.fileobj)
            else:
                self._read_head(key.fileobj)
            if not self.alive:
                return

    def _accept_all(self, listener):
        for _ in range(64):
            try:
                client, address = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EMFILE, errno.ENFILE):
                    return
                raise
            util.close_on_exec(client)
            deadline = time.monotonic() + self.read_timeout
            if self.cfg.is_ssl:
                # The head is encrypted: the TLS layer reads it in handle(), with the
                # read timeout applied to each read instead of to the whole request.
                client.setblocking(True)
                client.settimeout(self.read_timeout)
                self.handle(listener, client, address)
                continue
            client.setblocking(False)
            waiting = _Pending(listener, address, deadline)
            # Usually the whole request is already there: serve it at once.
            if self._advance(client, waiting):
                continue
            if len(self.pending) >= self.cfg.worker_connections:
                # Full: make room by dropping the connection that waited longest.
                oldest = min(self.pending, key=lambda c: self.pending[c].deadline)
                self._drop(oldest, "too many connections waiting")
            self.pending[client] = waiting
            self.selector.register(client, selectors.EVENT_READ, "client")

    def _read_head(self, client):
        self._advance(client, self.pending[client])

    def _advance(self, client, waiting: _Pending) -> bool:
        """Read what has arrived of the request head; serve the request once its
        head is complete. Return True when done with the connection."""
        try:
            data = client.recv(_READ_SIZE)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            # Closed before a whole request came: nothing to answer.
            self._forget_if_pending(client)
            util.close(client)
            return True
        waiting.head += data
        if b"\r\n\r\n" not in waiting.head and len(waiting.head) < HEAD_LIMIT:
            return False
        self._forget_if_pending(client)
        client.setblocking(True)
        self.handle(
            waiting.listener,
            DeadlineSocket(client, waiting.deadline, waiting.head),
            waiting.address,
        )
        self.notify()
        return True

    def _drop_expired(self):
        now = time.monotonic()
        for client, waiting in list(self.pending.items()):
            if waiting.deadline <= now:
                self._drop(client, f"no complete request within {self.read_timeout} s")

    def _drop(self, client, why: str):
        waiting = self._forget(client)
        util.close(client)
        address = waiting.address[0] if waiting.address else "unknown"
        self.log.warning(
            "Dropped a connection from %s after %d bytes: %s",
            address,
            len(waiting.head),
            why,
        )
        count_error(path=None, reason="read_timeout")

    def _forget(self, client) -> _Pending:
        self.selector.unregister(client)
        return self.pending.pop(client)

    def _forget_if_pending(self, client) -> None:
        if client in self.pending:
            self._forget(client)

    def handle_error(self, req, client, addr, exc):
        """gunicorn's own error answers, counted as extender errors."""
        if isinstance(exc, SystemExit):
            reason = "worker_timeout"
        elif type(exc).__name__ in _GUNICORN_REASONS:
            reason = _GUNICORN_REASONS[type(exc).__name__]
        elif isinstance(exc, ParseException) and not isinstance(
            exc,
            (InvalidResponseHeader, InvalidResponseHeaderName, ConfigurationProblem),
        ):
            reason = "bad_request"
        else:
            reason = "exception"
        count_error(path=getattr(req, "path", None), reason=reason)
        super().handle_error(req, client, addr, exc)


_GUNICORN_REASONS = {
    "LimitRequestLine": "uri_too_long",
    "LimitRequestHeaders": "header_fields_too_large",
    "UnsupportedTransferCoding": "not_implemented",
    "ForbiddenProxyRequest": "forbidden",
    "SSLError": "forbidden",
    "ExpectationFailed": "expectation_failed",
}


def acceptor_lock_path(master_pid: int) -> str:
    """The lock file whose holder is the acceptor among one master's workers; the
    master removes it when it exits (`kssched.gunicorn_conf.on_exit`)."""
    return os.path.join(tempfile.gettempdir(), f"kssched-acceptor-{master_pid}.lock")


def _busy_since() -> float:
    return _BUSY.unpack_from(_BUSY_SINCE)[0]


def _set_busy(since: float) -> None:
    _BUSY.pack_into(_BUSY_SINCE, 0, since)


def count_error(*, path: str | None, reason: str) -> None:
    """Count an error gunicorn answered (or a dropped connection) in
    `kssched_extender_errors_total`, never failing the caller."""
    try:
        from kssched.metrics import count_extender_error

        count_extender_error(path, reason)
    except Exception:
        logger.exception("Could not count an extender error (%s)", reason)


def write_json_error(sock, status_int, reason, mesg):
    """gunicorn's `util.write_error`, as a short JSON body: `{"Error": "..."}`."""
    body = json.dumps({"Error": f"{reason}: {mesg}" if mesg else reason}).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


class Logger(glogging.Logger):
    """gunicorn's logger, with the access log on only when `accesslog` is set.

    gunicorn logs every request as soon as `logconfig_dict` is given (it is, for the
    log format), whatever `accesslog` says: that would be a line per kube-scheduler
    call and per probe with KSSCHED_ACCESS_LOG=0.
    """

    @property
    def access_log_enabled(self):
        return bool(self.cfg.accesslog)
