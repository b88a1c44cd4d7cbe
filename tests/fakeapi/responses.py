"""Writing answers on the wire: JSON bodies, chunked streams and how streams end.

A stream ends in one of ``STREAM_ENDINGS``: a clean 0-chunk terminator (close),
a TCP reset (abort), half a chunk then a reset (truncate), nothing until
``release()`` or ``stop()`` (silent), or slow bookmarks then close (drip).
"""

from __future__ import annotations

import json
import socket
import struct
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from tests.fakeapi.actions import WatchAction
from tests.fakeapi.wire import encode_event

if TYPE_CHECKING:
    from tests.fakeapi.server import FakeApiServer


class Aborted(Exception):
    """The handler dropped the connection on purpose."""


def reset_connection(conn: socket.socket) -> None:
    """Reset a TCP connection (RST instead of FIN)."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def send_json(
    handler: BaseHTTPRequestHandler,
    code: int,
    body: Any,
    headers: dict | None = None,
) -> None:
    """Write a complete JSON response with a Content-Length."""
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(data)
    handler.wfile.flush()


class Stream:
    """A 200 response with ``Transfer-Encoding: chunked`` on one connection."""

    def __init__(self, handler: BaseHTTPRequestHandler, fake: FakeApiServer) -> None:
        self.handler = handler
        self.fake = fake

    def start(self) -> None:
        """Send the status line and headers."""
        self.handler.send_response(200)
        self.handler.send_header("Content-Type", "application/json")
        self.handler.send_header("Transfer-Encoding", "chunked")
        self.handler.end_headers()
        self.handler.wfile.flush()

    def chunk(self, data: bytes) -> None:
        """Send one chunk; empty data is skipped (it would end the stream)."""
        if not data:
            return
        self.handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.handler.wfile.flush()

    def abort(self) -> None:
        """Reset the connection and raise ``Aborted`` to unwind the handler."""
        self.handler.wfile.flush()
        reset_connection(self.handler.connection)
        raise Aborted

    def end(self, end: str, action: WatchAction | None, bm: dict) -> None:
        """End the stream as ``end`` says; drip and truncate send the bookmark ``bm``.

        Only a WatchAction's drip sends bookmarks; without one drip is a close.
        """
        if end == "drip" and action is not None:
            for _ in range(action.drip_count):
                time.sleep(action.drip_interval)
                self.chunk(encode_event(bm))
            end = "close"
        if end == "silent":
            end = "close" if self.fake.wait_for_release() else "abort"
        if end == "truncate":
            data = encode_event(bm)
            self.handler.wfile.write(b"%x\r\n%s" % (len(data), data[: len(data) // 2]))
            self.abort()
        if end == "abort":
            self.abort()
        self.handler.wfile.write(b"0\r\n\r\n")
        self.handler.wfile.flush()
