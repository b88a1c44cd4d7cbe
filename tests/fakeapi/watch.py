"""The cluster-mode watch: a streaming answer built from the store's history.

A watch starts from its ``resourceVersion`` (empty or "0": synthetic ADDED
events for what exists now), gets 410 once that point is compacted and 504 for
one from the future, sees each change translated for its selector, gets periodic
bookmarks when it asked for them, and ends cleanly at ``timeoutSeconds``.
"""

from __future__ import annotations

import bisect
import copy
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from tests.fakeapi.actions import ClusterWatch, too_large_rv
from tests.fakeapi.objects import RESOURCES
from tests.fakeapi.responses import Stream, send_json
from tests.fakeapi.routing import RecordedRequest
from tests.fakeapi.selectors import Selector
from tests.fakeapi.store import StoredEvent
from tests.fakeapi.wire import bookmark, encode_event, event, expired, status_body

if TYPE_CHECKING:
    from tests.fakeapi.server import FakeApiServer


def serve_watch(
    handler: BaseHTTPRequestHandler,
    fake: FakeApiServer,
    rec: RecordedRequest,
    selector: Selector,
    limit: ClusterWatch | None,
) -> None:
    """Stream one watch until it times out, is compacted away or hits ``limit``."""
    store = fake.store
    kind, api_version, _, _ = RESOURCES[rec.resource]
    rv_param = rec.query.get("resourceVersion", "")
    timeout = float(rec.query.get("timeoutSeconds") or fake.default_watch_timeout)
    want_bookmarks = rec.query.get("allowWatchBookmarks") in ("true", "1")
    interval = fake.bookmark_interval if want_bookmarks else None
    initial: list[dict[str, Any]] = []
    with store.cond:
        collection = store.collections[rec.resource]
        current = store.rv
        if rv_param in ("", "0"):
            # The API server starts such a watch with synthetic ADDED events.
            initial = [
                event("ADDED", copy.deepcopy(o))
                for _, o in sorted(collection.objects.items(), key=str)
                if selector.matches(o)
            ]
            pos = current
        else:
            try:
                pos = int(rv_param)
            except ValueError:
                msg = f"invalid resource version {rv_param!r}"
                send_json(handler, 400, status_body(400, message=msg))
                return
            if pos > current:
                action = too_large_rv(pos, current)
                send_json(handler, 504, action.body())
                return
    stream = Stream(handler, fake)
    stream.start()
    if pos < int(fake.compacted_rv):
        stream.chunk(encode_event(expired(pos, fake.compacted_rv)))
        stream.end("close", None, {})
        return
    end = limit.end if limit else "close"
    sent = 0

    def send(ev: dict[str, Any]) -> bool:
        """Write one event; True once the injected event limit is reached."""
        nonlocal sent
        stream.chunk(encode_event(ev))
        sent += 1
        return limit is not None and sent >= limit.max_events

    if limit is not None and limit.max_events <= 0:
        stream.end(end, None, bookmark(pos, kind, api_version))
        return
    for ev in initial:
        if send(ev):
            stream.end(end, None, bookmark(pos, kind, api_version))
            return
    now = time.monotonic()
    deadline = now + timeout
    next_bookmark = now + interval if interval else None
    while True:
        with store.cond:
            if pos < store.compacted:
                batch, gone = [], True
            else:
                gone = False
                start = bisect.bisect_right(collection.history, pos, key=_event_rv)
                batch = collection.history[start:]
            # Read with the batch: a bookmark must never skip an event that
            # is committed while this thread waits below.
            current = store.rv
            if not batch and not gone and not fake.is_stopping:
                wake = (
                    deadline if next_bookmark is None else min(deadline, next_bookmark)
                )
                store.cond.wait(max(0.0, wake - time.monotonic()))
                continue_waiting = True
            else:
                continue_waiting = False
            stopping = fake.is_stopping
        if stopping:
            stream.abort()
        if gone:
            stream.chunk(encode_event(expired(pos, fake.compacted_rv)))
            stream.end("close", None, {})
            return
        if not continue_waiting:
            for e in batch:
                ev = filtered_event(e, selector)
                pos = e.rv
                if ev is not None and send(ev):
                    stream.end(end, None, bookmark(pos, kind, api_version))
                    return
        now = time.monotonic()
        if next_bookmark is not None and now >= next_bookmark:
            stream.chunk(encode_event(bookmark(max(pos, current), kind, api_version)))
            pos = max(pos, current)
            next_bookmark = now + interval
        if now >= deadline:
            stream.end("close", None, {})
            return


def _event_rv(e: StoredEvent) -> int:
    return e.rv


def filtered_event(e: StoredEvent, selector: Selector) -> dict[str, Any] | None:
    """Translate a stored event for one watcher, as the API server's cache does.

    A change that moves an object into the selector is ADDED, out of it DELETED.
    """
    new_match = selector.matches(e.obj)
    if e.type == "ADDED":
        return event("ADDED", copy.deepcopy(e.obj)) if new_match else None
    if e.type == "DELETED":
        return event("DELETED", copy.deepcopy(e.obj)) if new_match else None
    old_match = selector.matches(e.old)
    if new_match and old_match:
        return event("MODIFIED", copy.deepcopy(e.obj))
    if new_match:
        return event("ADDED", copy.deepcopy(e.obj))
    if old_match:
        return event("DELETED", copy.deepcopy(e.obj))
    return None
