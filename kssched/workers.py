"""gunicorn parts for both listeners: the worker, and the logger.

`DeadlineWorker` serves both listeners. A plain sync worker reads a request with
blocking calls and no deadline, so a client that connects and sends nothing, half a
head, half a body, or no TLS handshake holds the worker until the worker timeout:
three such clients stopped every webhook call and probe on the pod port. This worker
instead accepts, runs the TLS handshake, and reads the request head and body (up to
BODY_IN_LOOP bytes) in its event loop, many connections at once, and runs the
application only for a connection whose request has arrived. A connection that has
not sent its whole request within the read timeout of its listener
(`KSSCHED_EXTENDER_READ_TIMEOUT`, `KSSCHED_WEB_READ_TIMEOUT`), counted from accept,
is closed and counted in `kssched_connections_dropped_total`. A body larger than
BODY_IN_LOOP, or chunked, is read by the application within the same deadline.

The workers of one listener watch it with EPOLLEXCLUSIVE: the kernel wakes one idle
worker per new connection, not all of them, and never one that is busy. kube-scheduler
calls one at a time, each call on a new connection, and its next call often arrives
before the worker that answered the last one is back waiting (the client has the
whole answer before the worker has finished with the request): the kernel then wakes
another worker, with cold caches, and consecutive calls alternated between workers,
each slower than one worker answering all of them. The kernel also queues the
connection on the epoll of the worker on its way back, which sees it as soon as it
waits again. So a worker woken for a connection while the worker that sent the last
answer is on its way back waits for it (at most HANDOVER from that answer), and once
it is back, for it to take the connection (at most GRACE from its return), before
accepting itself (`LastAnswer`): serial calls stay on one warm worker, while concurrent
calls, arriving while the other worker is busy with its request, are taken at once.
And a connection whose request the event loop read whole, with nothing more arriving,
is closed as soon as its answer is sent; gunicorn's lingering close (which waits up to
2 s for the client's FIN, to drain what it sent after its request) is kept for the
others.

gunicorn's own error answers (400/414/431 for a malformed head, 500 when a request
outlives the worker timeout) are HTML; on the extender listener they are short JSON
`{"Error": ...}` bodies instead, since kube-scheduler logs whatever it receives, and
each one is counted in `kssched_extender_errors_total`.
"""

import errno
import json
import logging
import mmap
import os
import re
import select
import socket
import ssl
import struct
import time
from collections.abc import Callable

from gunicorn import glogging, http, sock, util
from gunicorn.http.errors import (
    ConfigurationProblem,
    InvalidResponseHeader,
    InvalidResponseHeaderName,
    NoMoreData,
    ParseException,
)
from gunicorn.workers.sync import SyncWorker

from kssched import config

logger = logging.getLogger("kssched.workers")

# The request is read in pieces of this size; a head that has not ended after
# HEAD_LIMIT bytes is handed to gunicorn, which answers 431 or 400 for it.
_READ_SIZE = 64 * 1024
HEAD_LIMIT = 64 * 1024
# A Content-Length body up to this size is read in the event loop (5000 node names
# are 181 KB); a larger one, or a chunked one, by the application, within the same
# deadline.
BODY_IN_LOOP = 1024 * 1024
# At most this many bytes of unfinished requests wait in one worker's event loop;
# past it, the connection that has waited longest is dropped (`too_many`).
PENDING_BYTES = 64 * 1024 * 1024
# At most one warning about dropped connections per this many seconds per worker;
# the others are counted in it and in kssched_connections_dropped_total.
WARN_EVERY = 10.0

# A worker woken for a new connection while the one that sent the last answer is on
# its way back waits for it at most HANDOVER after that answer began, then at most
# GRACE after its return for it to take the connection, looking every HANDOVER_STEP
# seconds (see `LastAnswer`).
HANDOVER = 0.001
GRACE = 0.0003
HANDOVER_STEP = 0.00005

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]+)[ \t]*\r\n", re.I)
# A chunked body, or a client waiting for `100 Continue` before its body: the
# application reads the body (gunicorn answers the Expect).
_APPLICATION_READS = re.compile(rb"\r\n(transfer-encoding|expect):", re.I)


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
    read raises ReadTimeout. Writes go to the socket, after telling `sending`;
    everything else goes to the socket unchanged.
    """

    def __init__(
        self,
        sock: socket.socket,
        deadline: float,
        buffered: bytes,
        *,
        whole: bool = False,
        sending: Callable[[], None] | None = None,
    ):
        self._sock = sock
        self._deadline = deadline
        self._buffered = buffered
        # Where the next read of `buffered` starts: the rest is never copied again.
        self._offset = 0
        # Whether `buffered` is exactly one whole request (nothing left to arrive).
        self.whole = whole
        # Called before each write of the answer.
        self._sending = sending

    def recv(self, size: int, *flags) -> bytes:
        if self._offset < len(self._buffered):
            start = self._offset
            self._offset = start + size
            return self._buffered[start : start + size]
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

    def sendall(self, data, *flags) -> None:
        if self._sending is not None:
            self._sending()
        self._sock.sendall(data, *flags)

    def close_answered(self) -> None:
        """Close the connection once its answer has been sent.

        When the event loop read the whole request and nothing has arrived since,
        the kernel's receive buffer is empty: a plain close sends FIN after the
        answer, with no reset that could truncate it, and the worker goes back to
        waiting at once. Otherwise (the application read the body, bytes came after
        the request, TLS) gunicorn's lingering close drains what the client sent.
        """
        if self.whole and not isinstance(self._sock, ssl.SSLSocket):
            try:
                unread = self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except OSError:
                # Nothing arrived (BlockingIOError), or the connection is gone.
                unread = b""
            if not unread:
                util.close(self._sock)
                return
        util.close_graceful(self)

    def __getattr__(self, name):
        return getattr(self._sock, name)


class LastAnswer:
    """The worker of one gunicorn master that sent an answer last: when it began
    sending it, when it was back waiting for connections, and when it took one
    since, in memory its workers share (mapped by the master, before it forks them).

    `give_way` keeps serial calls on that worker. Another worker, woken for a new
    connection while it is on its way back, waits for it (at most HANDOVER from its
    answer), then for it to take the connection (at most GRACE from its return: a
    level-triggered listener stays on the ready list of the epoll that reported it
    last, so that worker sees a connection that came before it waits again). A worker
    that has taken a connection since its return is busy with a request, so a
    concurrent call is taken at once; so is a call to a worker that has been back
    longer than GRACE (both are idle, and the kernel woke this one).
    """

    # pid, sent, back, took: each time 0 until it happens after the last answer.
    _SLOT = struct.Struct("qddd")

    def __init__(self) -> None:
        self._shared = mmap.mmap(-1, self._SLOT.size)

    def read(self) -> tuple[int, float, float, float]:
        """(pid, began sending, back waiting, took a connection)."""
        return self._SLOT.unpack_from(self._shared)

    def sending(self, pid: int) -> None:
        """Worker `pid` is sending an answer."""
        self._SLOT.pack_into(self._shared, 0, pid, time.monotonic(), 0.0, 0.0)

    def waiting(self, pid: int) -> None:
        """Worker `pid` is back waiting for connections."""
        last, sent, _, _ = self.read()
        if last == pid and sent:
            self._SLOT.pack_into(self._shared, 0, pid, 0.0, time.monotonic(), 0.0)

    def took(self, pid: int) -> None:
        """Worker `pid` accepted a connection."""
        last, sent, back, took = self.read()
        if last == pid and back and not took:
            self._SLOT.pack_into(self._shared, 0, pid, 0.0, back, time.monotonic())

    def give_way(self, pid: int) -> None:
        """Before worker `pid` accepts: while the worker that answered last is on
        its way back, or back and about to take the connection."""
        while True:
            state = self.read()
            last, sent, back, took = state
            if not last or last == pid or took:
                return
            until = sent + HANDOVER if sent else back + GRACE
            while self.read() == state:
                if time.monotonic() >= until:
                    return
                time.sleep(HANDOVER_STEP)


# struct tcp_info (linux/tcp.h): for a listening socket, tcpi_unacked is the number of
# connections waiting to be accepted.
_TCP_INFO_SIZE = 104
_TCPI_UNACKED = struct.Struct("=I")
_TCPI_UNACKED_OFFSET = 24


def waiting_connections(listener) -> int:
    """How many connections wait in the accept queue of a TCP listener (1 when the
    kernel cannot tell, as for a Unix socket)."""
    try:
        info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except OSError:
        return 1
    if len(info) < _TCPI_UNACKED_OFFSET + _TCPI_UNACKED.size:
        return 1
    return _TCPI_UNACKED.unpack_from(info, _TCPI_UNACKED_OFFSET)[0]


# Shared by the workers of the gunicorn master that imports this module to load
# the worker class.
LAST_ANSWER = LastAnswer()


class _Pending:
    """A connection whose request is still arriving."""

    __slots__ = (
        "sock",
        "listener",
        "address",
        "deadline",
        "data",
        "shaking",
        "need",
        "events",
    )

    def __init__(self, sock, listener, address, deadline: float, shaking: bool):
        self.sock = sock
        self.listener = listener
        self.address = address
        self.deadline = deadline
        self.data = b""
        # True while the TLS handshake runs.
        self.shaking = shaking
        # The length of the whole request, once its head has arrived.
        self.need: int | None = None
        # What to wait for next: EPOLLIN, or EPOLLOUT while TLS must write.
        self.events = select.EPOLLIN

    def complete(self) -> bool:
        """Whether enough has arrived to hand the request to the application."""
        if self.need is None:
            end = self.data.find(b"\r\n\r\n")
            if end < 0:
                return len(self.data) >= HEAD_LIMIT
            head = self.data[: end + 2]
            length = _CONTENT_LENGTH.search(head)
            if _APPLICATION_READS.search(head) or not length:
                return True
            body = int(length.group(1))
            if body > BODY_IN_LOOP:
                return True
            self.need = end + 4 + body
        return len(self.data) >= self.need


class DropWarning:
    """Warns about dropped connections at most once per `every` seconds, with how
    many were dropped since the last warning."""

    def __init__(self, log, every: float = WARN_EVERY):
        self.log = log
        self.every = every
        self.last = float("-inf")
        self.suppressed = 0

    def dropped(self, address: str, size: int, why: str) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            self.suppressed += 1
            return
        more = (
            f" ({self.suppressed} more in the last {now - self.last:.0f} s)"
            if self.suppressed
            else ""
        )
        self.log.warning(
            "Dropped a connection from %s after %d bytes: %s%s",
            address,
            size,
            why,
            more,
        )
        self.last, self.suppressed = now, 0


class DeadlineWorker(SyncWorker):
    """A sync worker that accepts, handshakes and reads requests in its event loop,
    with a deadline, and runs the application one request at a time."""

    def init_process(self):
        settings = config.load()
        self.listener_name = settings.listener
        self.read_timeout = settings.read_timeout
        self.warning = DropWarning(self.log)
        self.served = False
        if self.listener_name == "extender":
            # gunicorn's error pages, as JSON for kube-scheduler (this process
            # serves only the extender listener).
            util.write_error = write_json_error
        super().init_process()

    def run(self) -> None:
        self.me = os.getpid()
        self.poller = select.epoll()
        self.pending: dict[int, _Pending] = {}
        self.pending_bytes = 0
        self.listeners = {}
        for listener in self.sockets:
            listener.setblocking(False)
            self.listeners[listener.fileno()] = listener
            self.poller.register(
                listener.fileno(), select.EPOLLIN | select.EPOLLEXCLUSIVE
            )
        self.poller.register(self.PIPE[0], select.EPOLLIN)
        try:
            while self.alive:
                self.notify()
                self._wait_and_serve()
                self._drop_expired()
                if not self.is_parent_alive():
                    break
        finally:
            for waiting in list(self.pending.values()):
                self._forget(waiting)
                util.close(waiting.sock)
            self.poller.close()

    def _wait_and_serve(self):
        timeout = 1.0
        if self.pending:
            first = min(p.deadline for p in self.pending.values())
            timeout = max(0.0, min(timeout, first - time.monotonic()))
        LAST_ANSWER.waiting(self.me)
        try:
            events = self.poller.poll(timeout)
        except InterruptedError:
            return
        for fd, _ in events:
            if fd == self.PIPE[0]:
                try:
                    while os.read(self.PIPE[0], 64):
                        pass
                except BlockingIOError:
                    pass
            elif fd in self.listeners:
                self._accept_all(self.listeners[fd])
            elif fd in self.pending:
                self._advance(self.pending[fd])
            if not self.alive:
                return

    def _accept_all(self, listener):
        if waiting_connections(listener) < 2:
            # One call waiting, maybe a serial one: see LastAnswer. With more,
            # calls are concurrent, and every idle worker should take one.
            LAST_ANSWER.give_way(self.me)
        for _ in range(64):
            try:
                client, address = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EMFILE, errno.ENFILE):
                    return
                raise
            LAST_ANSWER.took(self.me)
            util.close_on_exec(client)
            client.setblocking(False)
            deadline = time.monotonic() + self.read_timeout
            shaking = False
            if self.cfg.is_ssl:
                try:
                    # The handshake runs in _advance, never blocking the loop.
                    client = sock.ssl_context(self.cfg).wrap_socket(
                        client,
                        server_side=True,
                        do_handshake_on_connect=False,
                        suppress_ragged_eofs=self.cfg.suppress_ragged_eofs,
                    )
                except (OSError, ValueError):
                    util.close(client)
                    continue
                shaking = True
            waiting = _Pending(client, listener, address, deadline, shaking)
            # Usually the whole request is already there: serve it at once, then
            # let the kernel hand the next connection to whichever worker is idle.
            self.served = False
            if self._advance(waiting, registered=False):
                if self.served:
                    return
                continue
            if len(self.pending) >= self.cfg.worker_connections:
                # Full: make room by dropping the connection that waited longest.
                oldest = min(self.pending.values(), key=lambda p: p.deadline)
                self._drop(oldest, "too many connections waiting", "too_many")
            self.pending[client.fileno()] = waiting
            self.pending_bytes += len(waiting.data)
            self._bound_pending_bytes(keep=waiting)
            self.poller.register(client.fileno(), waiting.events)

    def _advance(self, waiting: _Pending, registered: bool = True) -> bool:
        """Handshake, then read what has arrived of the request; serve it once it is
        complete. Return True when done with the connection."""
        client = waiting.sock
        if waiting.shaking:
            try:
                client.do_handshake()
            except ssl.SSLWantReadError:
                return self._rearm(waiting, registered, write=False)
            except ssl.SSLWantWriteError:
                return self._rearm(waiting, registered, write=True)
            except (ssl.SSLError, OSError) as exc:
                self.log.debug("TLS handshake failed: %s", exc)
                if registered:
                    self._forget(waiting)
                util.close(client)
                _count_drop(self.listener_name, "tls_handshake")
                return True
            waiting.shaking = False
        while True:
            try:
                data = client.recv(_READ_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError):
                return self._rearm(waiting, registered, write=False)
            except ssl.SSLWantWriteError:
                return self._rearm(waiting, registered, write=True)
            except OSError:
                data = b""
            if not data:
                # Closed before a whole request came: nothing to answer.
                if registered:
                    self._forget(waiting)
                util.close(client)
                return True
            waiting.data += data
            if registered:
                self.pending_bytes += len(data)
                self._bound_pending_bytes(keep=waiting)
            if waiting.complete():
                break
        if registered:
            self._forget(waiting)
        client.setblocking(True)
        self.served = True
        self.handle(
            waiting.listener,
            DeadlineSocket(
                client,
                waiting.deadline,
                waiting.data,
                whole=len(waiting.data) == waiting.need,
                sending=self._sending,
            ),
            waiting.address,
        )
        self.notify()
        return True

    def _sending(self) -> None:
        LAST_ANSWER.sending(self.me)

    def _rearm(self, waiting: _Pending, registered: bool, *, write: bool) -> bool:
        events = select.EPOLLOUT if write else select.EPOLLIN
        if registered and events != waiting.events:
            self.poller.modify(waiting.sock.fileno(), events)
        waiting.events = events
        return False

    def handle(self, listener, client, addr):
        """gunicorn's SyncWorker.handle, for a socket this worker has already
        wrapped in TLS and read from."""
        req = None
        try:
            parser = http.get_parser(self.cfg, client, addr)
            req = next(parser)
            self.handle_request(listener, req, client, addr)
        except http.errors.NoMoreData as e:
            self.log.debug("Ignored premature client disconnection. %s", e)
            if isinstance(e, ReadTimeout):
                _count_drop(self.listener_name, "read_timeout")
        except StopIteration as e:
            self.log.debug("Closing connection. %s", e)
        except ssl.SSLError as e:
            if e.args[0] == ssl.SSL_ERROR_EOF:
                self.log.debug("ssl connection closed")
                client.close()
            else:
                self.log.debug("Error processing SSL request.")
                self.handle_error(req, client, addr, e)
        except OSError as e:
            if e.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.log.exception("Socket error processing request.")
            else:
                self.log.debug("Ignoring %s", e)
        except BaseException as e:
            self.handle_error(req, client, addr, e)
        finally:
            client.close_answered()

    def _drop_expired(self):
        now = time.monotonic()
        for waiting in list(self.pending.values()):
            if waiting.deadline <= now:
                why = "TLS handshake" if waiting.shaking else "request"
                self._drop(
                    waiting,
                    f"no complete {why} within {self.read_timeout} s",
                    "read_timeout",
                )

    def _drop(self, waiting: _Pending, why: str, reason: str):
        self._forget(waiting)
        util.close(waiting.sock)
        address = waiting.address[0] if waiting.address else "unknown"
        self.warning.dropped(address, len(waiting.data), why)
        _count_drop(self.listener_name, reason)
        if self.listener_name == "extender":
            count_error(path=None, reason="read_timeout")

    def _bound_pending_bytes(self, keep: _Pending) -> None:
        while self.pending_bytes > PENDING_BYTES and len(self.pending) > 1:
            oldest = min(
                (p for p in self.pending.values() if p is not keep),
                key=lambda p: p.deadline,
            )
            self._drop(oldest, "too many bytes waiting", "too_many")

    def _forget(self, waiting: _Pending) -> None:
        fd = waiting.sock.fileno()
        if self.pending.pop(fd, None) is not None:
            self.pending_bytes -= len(waiting.data)
        try:
            self.poller.unregister(fd)
        except (OSError, ValueError):
            pass

    def handle_error(self, req, client, addr, exc):
        """gunicorn's own error answers, counted as extender errors."""
        if self.listener_name != "extender":
            super().handle_error(req, client, addr, exc)
            return
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


def _count_drop(listener: str, reason: str) -> None:
    """Count a connection closed before its request was served, never failing."""
    try:
        from kssched.metrics import count_dropped_connection

        count_dropped_connection(listener, reason)
    except Exception:
        logger.exception("Could not count a dropped connection (%s)", reason)


_GUNICORN_REASONS = {
    "LimitRequestLine": "uri_too_long",
    "LimitRequestHeaders": "header_fields_too_large",
    "UnsupportedTransferCoding": "not_implemented",
    "ForbiddenProxyRequest": "forbidden",
    "SSLError": "forbidden",
    "ExpectationFailed": "expectation_failed",
}


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
