"""``FakeApiServer``: lifecycle, recorded requests, scripting and cluster state.

It listens on 127.0.0.1 in a background thread. One reentrant lock and its
condition guard everything: recorded requests, queued actions, armed faults,
open connections and the store; every change notifies the condition so that
waiting watches and ``wait_for_requests`` wake up.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from tests.fakeapi.actions import Action, Injection, next_action
from tests.fakeapi.handler import ApiHTTPServer, Handler
from tests.fakeapi.objects import DEFAULT_NAMESPACE, make_node
from tests.fakeapi.responses import reset_connection
from tests.fakeapi.routing import RecordedRequest
from tests.fakeapi.store import Store


class FakeApiServer:
    """A fake API server on 127.0.0.1; see the ``tests.fakeapi`` docstring."""

    def __init__(
        self,
        *,
        port: int = 0,
        bookmark_interval: float | None = 1.0,
        default_watch_timeout: float = 30.0,
        start: bool = True,
    ) -> None:
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._requests: list[RecordedRequest] = []
        self._queue: list[Action] = []
        self._injections: list[Injection] = []
        self.store = Store(self._cond)
        self._release_gen = 0
        self._stopping = False
        self._conns: set[socket.socket] = set()
        self._httpd: ApiHTTPServer | None = None
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # ---- lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def is_running(self) -> bool:
        return self._httpd is not None

    @property
    def is_stopping(self) -> bool:
        """True while ``stop()`` runs; open streams end with a reset."""
        with self._lock:
            return self._stopping

    def start(self) -> None:
        """Listen (again) on ``self.port``; state and scripts survive a restart."""
        if self._httpd is not None:
            return
        with self._lock:
            self._stopping = False
        httpd = ApiHTTPServer(("127.0.0.1", self.port), Handler)
        httpd.fake = self
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and reset every open connection (connection refused)."""
        httpd = self._httpd
        if httpd is None:
            return
        with self._lock:
            self._stopping = True
            self._cond.notify_all()
            conns = list(self._conns)
        httpd.shutdown()
        httpd.server_close()
        for conn in conns:
            reset_connection(conn)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> FakeApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- requests

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of every recorded request, oldest first."""
        with self._lock:
            return list(self._requests)

    def watch_requests(self, resource: str | None = None) -> list[RecordedRequest]:
        return [
            r
            for r in self.requests
            if r.is_watch and (resource is None or r.resource == resource)
        ]

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> bool:
        """Block until at least ``count`` requests were recorded; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    # ---- scripting and faults

    def script(self, *actions: Action) -> None:
        """Queue actions; each request consumes the first one whose filter fits."""
        with self._lock:
            self._queue.extend(actions)

    @property
    def pending_actions(self) -> list[Action]:
        with self._lock:
            return list(self._queue)

    def inject(
        self,
        action: Action,
        *,
        times: int = 1,
        verb: str | None = "watch",
        resource: str | None = "pods",
    ) -> None:
        """Give the next ``times`` requests matching verb/resource this action.

        verb: list, watch, get, create, update, delete, or None for any.
        """
        with self._lock:
            self._injections.append(Injection(action, times, verb, resource))

    def release(self) -> None:
        """End every ``silent`` stream with a clean close."""
        with self._lock:
            self._release_gen += 1
            self._cond.notify_all()

    # ---- cluster state

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self.store.rv)

    @property
    def compacted_rv(self) -> str:
        with self._lock:
            return str(self.store.compacted)

    def compact(self, rv: str | int | None = None) -> None:
        """Forget history up to ``rv`` (default: now); older watches get 410."""
        self.store.compact(rv)

    def events(self, resource: str = "pods") -> list[dict[str, Any]]:
        """The kept history of one resource as watch events."""
        return self.store.events(resource)

    def objects(self, resource: str = "pods") -> list[dict[str, Any]]:
        return self.store.objects(resource)

    def get(
        self, resource: str, name: str, namespace: str | None = DEFAULT_NAMESPACE
    ) -> dict[str, Any] | None:
        return self.store.get(resource, name, namespace)

    def add(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object; returns the stored copy with its new resourceVersion."""
        return self.store.add(resource, obj)

    def modify(
        self,
        resource: str,
        name: str,
        changes: Callable[[dict[str, Any]], Any] | dict[str, Any],
        namespace: str | None = DEFAULT_NAMESPACE,
    ) -> dict[str, Any]:
        """Change an object (callable mutating a copy, or a dict deep-merged)."""
        return self.store.modify(resource, name, changes, namespace)

    def delete(
        self, resource: str, name: str, namespace: str | None = DEFAULT_NAMESPACE
    ) -> dict[str, Any]:
        return self.store.delete(resource, name, namespace)

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self.add("pods", pod)

    def add_pods(self, pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        with self._lock:
            return [self.store.add("pods", pod) for pod in pods]

    def modify_pod(self, name: str, changes: Any, namespace: str = DEFAULT_NAMESPACE):
        return self.modify("pods", name, changes, namespace)

    def bind_pod(
        self,
        name: str,
        node: str,
        namespace: str = DEFAULT_NAMESPACE,
        phase: str = "Running",
    ) -> dict[str, Any]:
        """Set ``spec.nodeName`` and the phase, as the binding and kubelet do."""
        return self.modify(
            "pods",
            name,
            {"spec": {"nodeName": node}, "status": {"phase": phase}},
            namespace,
        )

    def delete_pod(self, name: str, namespace: str = DEFAULT_NAMESPACE):
        return self.delete("pods", name, namespace)

    def add_node(self, node: dict[str, Any]) -> dict[str, Any]:
        return self.add("nodes", node)

    def delete_node(self, name: str) -> dict[str, Any]:
        return self.delete("nodes", name, None)

    def replace_node(self, name: str) -> dict[str, Any]:
        """Delete a node and add one with the same name and a new UID."""
        with self._lock:
            self.store.delete("nodes", name, None)
            return self.store.add("nodes", make_node(name))

    # ---- used by the request handler

    def track_connection(self, conn: socket.socket) -> None:
        """Remember an open connection so that ``stop()`` can reset it."""
        with self._lock:
            self._conns.add(conn)

    def forget_connection(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.discard(conn)

    def record_request(self, rec: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(rec)
            self._cond.notify_all()

    def next_action(self, rec: RecordedRequest) -> Action | None:
        """The fault or scripted action ``rec`` consumes; None serves the cluster."""
        with self._lock:
            return next_action(self._injections, self._queue, rec)

    def wait_for_release(self) -> bool:
        """Block a ``silent`` stream: True after ``release()``, False on ``stop()``."""
        with self._cond:
            gen = self._release_gen
            while not self._stopping and self._release_gen == gen:
                self._cond.wait(0.5)
            return not self._stopping
