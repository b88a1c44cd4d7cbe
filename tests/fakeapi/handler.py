"""The HTTP request handler: record, pick an action or the cluster, answer.

Every request is recorded, then answered by the injected fault or scripted
action it consumes (``actions.next_action``) or, without one, from the store.
"""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from tests.fakeapi.actions import (
    Action,
    ClusterWatch,
    JsonAction,
    ListAction,
    RawAction,
    StatusAction,
    WatchAction,
)
from tests.fakeapi.objects import RESOURCES
from tests.fakeapi.responses import Aborted, Stream, send_json
from tests.fakeapi.rest import list_objects, write_object
from tests.fakeapi.routing import RecordedRequest, parse_request
from tests.fakeapi.selectors import Selector, SelectorError
from tests.fakeapi.watch import serve_watch
from tests.fakeapi.wire import bookmark, encode_event, status_body

if TYPE_CHECKING:
    from tests.fakeapi.server import FakeApiServer


class ApiHTTPServer(ThreadingHTTPServer):
    """The listening socket; ``fake`` is the FakeApiServer it serves."""

    daemon_threads = True
    allow_reuse_address = True
    fake: FakeApiServer


class Handler(BaseHTTPRequestHandler):
    """One connection; HTTP/1.1 keep-alive, so possibly many requests."""

    protocol_version = "HTTP/1.1"
    server: ApiHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def setup(self) -> None:
        super().setup()
        self.server.fake.track_connection(self.connection)

    def handle(self) -> None:
        # stop() resets idle keep-alive connections; that is not an error here.
        try:
            super().handle()
        except (OSError, ValueError):
            self.close_connection = True

    def finish(self) -> None:
        self.server.fake.forget_connection(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length else b""
        rec = parse_request(self.command, self.path, raw_body)
        fake.record_request(rec)
        try:
            action = fake.next_action(rec)
            if action is None:
                self._serve_cluster(rec)
            else:
                self._perform(action, rec)
        except Aborted:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def _perform(self, action: Action, rec: RecordedRequest) -> None:
        """Answer with a scripted or injected action."""
        if isinstance(action, StatusAction):
            headers = {}
            if action.retry_after is not None:
                headers["Retry-After"] = str(action.retry_after)
            send_json(self, action.code, action.body(), headers)
        elif isinstance(action, JsonAction):
            send_json(self, action.code, action.body, action.headers)
        elif isinstance(action, ListAction):
            body = {
                "kind": action.kind,
                "apiVersion": action.api_version,
                "metadata": {"resourceVersion": str(action.resource_version)},
                "items": action.items,
            }
            if action.continue_token:
                body["metadata"]["continue"] = action.continue_token
            send_json(self, 200, body)
        elif isinstance(action, WatchAction):
            stream = Stream(self, self.server.fake)
            stream.start()
            for i, ev in enumerate(action.events):
                if i and action.interval:
                    time.sleep(action.interval)
                stream.chunk(encode_event(ev))
            last_rv = action.bookmark_rv or _last_rv(action.events) or "1"
            kind = RESOURCES.get(rec.resource or "pods", RESOURCES["pods"])[0]
            stream.end(action.end, action, bookmark(last_rv, kind))
        elif isinstance(action, RawAction):
            stream = Stream(self, self.server.fake)
            stream.start()
            for i, chunk in enumerate(action.chunks):
                if i and action.interval:
                    time.sleep(action.interval)
                stream.chunk(chunk)
            stream.end(action.end, None, bookmark("1"))
        elif isinstance(action, ClusterWatch):
            self._serve_cluster(rec, action)
        else:
            raise TypeError(f"unknown action {action!r}")

    def _serve_cluster(
        self, rec: RecordedRequest, limit: ClusterWatch | None = None
    ) -> None:
        """Answer from the store: 404 off the served paths, 405 for other methods."""
        fake = self.server.fake
        if rec.resource is None:
            send_json(self, 404, status_body(404, message=f"no route for {rec.path}"))
            return
        if rec.verb is None:
            send_json(self, 405, status_body(405, message=f"{rec.method} not allowed"))
            return
        try:
            selector = Selector(rec.query, rec.namespace)
        except SelectorError as exc:
            send_json(self, 400, status_body(400, message=str(exc)))
            return
        if rec.verb == "watch":
            serve_watch(self, fake, rec, selector, limit)
        elif rec.verb == "list":
            send_json(self, *list_objects(fake.store, rec, selector))
        else:
            send_json(self, *write_object(fake.store, rec))


def _last_rv(events: list[dict[str, Any]]) -> str | None:
    """The resourceVersion of the last event that carries one."""
    for ev in reversed(events):
        obj = ev.get("object") if isinstance(ev, dict) else None
        rv = (obj or {}).get("metadata", {}).get("resourceVersion")
        if rv:
            return str(rv)
    return None
