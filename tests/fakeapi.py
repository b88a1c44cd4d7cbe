"""A fake Kubernetes API server that speaks the real list/watch wire protocol.

Tests point the unmodified ``kubernetes`` client at it with
``kubernetes.client.Configuration(host=server.url)``. Standard library only.

Every request is answered in this order:

1. an injected fault whose filter matches (``inject``; consumed ``times`` times);
2. the first queued scripted action whose filter matches (``script``);
3. otherwise "cluster mode": a small in-memory API server holding Pods, Nodes and
   Leases with one monotonically increasing resourceVersion, an event history,
   a compaction point, periodic bookmarks and optimistic concurrency.

Served paths: ``/api/v1/pods``, ``/api/v1/namespaces/{ns}/pods[/{name}]``,
``/api/v1/nodes[/{name}]``, ``/apis/coordination.k8s.io/v1/leases`` and
``/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]``.

Scripted example::

    with FakeApiServer() as server:
        server.script(
            ListAction([make_pod("a", rv="10")], resource_version="10"),
            WatchAction([event("ADDED", make_pod("b", rv="11"))], end="abort"),
            StatusAction(500),
        )

Cluster example::

    with FakeApiServer(bookmark_interval=0.2) as server:
        server.add_pod(make_pod("a"))
        rv = server.resource_version
        server.bind_pod("a", "node-1")
        server.inject(ClusterWatch(max_events=1, end="abort"), verb="watch")
        server.compact()
"""

from __future__ import annotations

import base64
import bisect
import copy
import json
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

DEFAULT_NAMESPACE = "ks-pipelines"
PIPELINE_LABEL = "ks-pipeline"
SCHEDULER_NAME = "ks-scheduler"
CREATION_TIMESTAMP = "2026-01-01T00:00:00Z"

# resource -> (kind, apiVersion, group for error messages, namespaced)
RESOURCES = {
    "pods": ("Pod", "v1", "", True),
    "nodes": ("Node", "v1", "", False),
    "leases": ("Lease", "coordination.k8s.io/v1", "coordination.k8s.io", True),
}

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

STREAM_ENDINGS = ("close", "abort", "truncate", "silent", "drip")


# --------------------------------------------------------------------------- builders


def make_pod(
    name: str,
    uid: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    node: str | None = None,
    label: str | None = "pipeline1",
    scheduler: str = SCHEDULER_NAME,
    phase: str = "Pending",
    rv: str | int = "1",
) -> dict[str, Any]:
    """Return a Pod dict shaped like one a Job creates; ``label=None`` omits it."""
    labels = {"job-name": name, "ks-step": "step"}
    if label is not None:
        labels[PIPELINE_LABEL] = label
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "step",
                "image": "registry.example.com/ks/pipeline-step:1.4.2",
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": scheduler,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    status: dict[str, Any] = {"phase": phase, "qosClass": "Burstable"}
    if node is not None:
        spec["nodeName"] = node
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": CREATION_TIMESTAMP,
            }
        ]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid4()),
            "resourceVersion": str(rv),
            "creationTimestamp": CREATION_TIMESTAMP,
            "labels": labels,
        },
        "spec": spec,
        "status": status,
    }


def make_node(name: str, uid: str | None = None, rv: str | int = "1") -> dict[str, Any]:
    """Return a Ready Node dict; a replaced node keeps its name, not its UID."""
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": uid or str(uuid.uuid4()),
            "resourceVersion": str(rv),
            "creationTimestamp": CREATION_TIMESTAMP,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastTransitionTime": CREATION_TIMESTAMP,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "boot",
                "containerRuntimeVersion": "containerd://1.7.0",
                "kernelVersion": "6.1.0",
                "kubeProxyVersion": "v1.31.0",
                "kubeletVersion": "v1.31.0",
                "machineID": "machine",
                "operatingSystem": "linux",
                "osImage": "Debian GNU/Linux 12",
                "systemUUID": "system",
            },
        },
    }


def make_lease(
    name: str,
    holder: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    duration: int = 15,
) -> dict[str, Any]:
    """Return a Lease body suitable for POST (no resourceVersion)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    spec: dict[str, Any] = {"leaseDurationSeconds": duration, "leaseTransitions": 0}
    if holder is not None:
        spec.update(holderIdentity=holder, acquireTime=now, renewTime=now)
    return {
        "kind": "Lease",
        "apiVersion": "coordination.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def status_body(
    code: int,
    reason: str | None = None,
    message: str | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return a ``Status`` object as the API server sends it for failures."""
    reason = reason or REASONS.get(code, "Unknown")
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message or reason,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def event(type_: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Return one watch event ``{"type": ..., "object": ...}``."""
    return {"type": type_, "object": obj}


def bookmark(rv: str | int, kind: str = "Pod", api_version: str = "v1") -> dict:
    """Return a BOOKMARK event that carries only the resourceVersion."""
    obj = {"kind": kind, "apiVersion": api_version}
    obj["metadata"] = {"resourceVersion": str(rv)}
    return event("BOOKMARK", obj)


def expired(requested: str | int = "1", oldest: str | int = "100") -> dict:
    """Return the 410 ERROR event sent for a compacted resourceVersion."""
    msg = f"too old resource version: {requested} ({oldest})"
    return event("ERROR", status_body(410, "Expired", msg))


def encode_event(ev: dict[str, Any]) -> bytes:
    """Encode one event as the API server does: a JSON object and a newline."""
    return json.dumps(ev, separators=(",", ":")).encode() + b"\n"


# --------------------------------------------------------------------------- actions


@dataclass
class ListAction:
    """Answer a list request with these items (200, ``<Kind>List``)."""

    items: list[dict[str, Any]]
    resource_version: str | int = "1"
    kind: str = "PodList"
    api_version: str = "v1"
    continue_token: str | None = None
    resource: str | None = None


@dataclass
class WatchAction:
    """Answer with a 200 chunked stream of events, then end as ``end`` says.

    ``end``: close (0-chunk terminator), abort (RST), truncate (half a chunk, then
    RST), silent (send nothing until the server stops or ``release()``), drip
    (``drip_count`` bookmarks ``drip_interval`` seconds apart, then close).
    """

    events: list[dict[str, Any]] = field(default_factory=list)
    end: str = "close"
    interval: float = 0.0
    drip_count: int = 3
    drip_interval: float = 1.0
    bookmark_rv: str | int | None = None
    resource: str | None = None

    def __post_init__(self) -> None:
        if self.end not in STREAM_ENDINGS:
            raise ValueError(f"unknown stream ending {self.end!r}")


@dataclass
class RawAction:
    """Answer with a 200 chunked stream of these exact chunks, then end."""

    chunks: list[bytes]
    end: str = "close"
    interval: float = 0.0
    resource: str | None = None


@dataclass
class StatusAction:
    """Answer with an HTTP error status and a ``Status`` body."""

    code: int
    reason: str | None = None
    message: str | None = None
    retry_after: int | None = None
    details: dict[str, Any] | None = None
    resource: str | None = None

    def body(self) -> dict[str, Any]:
        return status_body(self.code, self.reason, self.message, self.details)


@dataclass
class JsonAction:
    """Answer with any status and JSON body."""

    code: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    resource: str | None = None


@dataclass
class ClusterWatch:
    """Serve the watch from the cluster, but end after ``max_events`` events.

    Only ADDED/MODIFIED/DELETED count; ``end`` is one of the stream endings
    (``drip`` behaves like ``close`` here).
    """

    max_events: int
    end: str = "abort"
    resource: str | None = None


def too_large_rv(requested: str | int, current: str | int) -> StatusAction:
    """The 504 the API server sends for a resourceVersion from the future."""
    return StatusAction(
        504,
        "Timeout",
        f"Too large resource version: {requested}, current: {current}",
        details={
            "causes": [
                {
                    "reason": "ResourceVersionTooLarge",
                    "message": "Too large resource version",
                }
            ],
            "retryAfterSeconds": 1,
        },
    )


def conflict(name: str, resource: str = "leases") -> StatusAction:
    """The 409 an update with a stale resourceVersion gets."""
    return StatusAction(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(resource)} "{name}": the '
        "object has been modified; please apply your changes to the latest "
        "version and try again",
        details={"name": name, "group": RESOURCES[resource][2], "kind": resource},
    )


Action = ListAction | WatchAction | RawAction | StatusAction | JsonAction | ClusterWatch


def _qualified(resource: str) -> str:
    group = RESOURCES.get(resource, ("", "", "", False))[2]
    return f"{resource}.{group}" if group else resource


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    verb: str | None
    resource: str | None
    namespace: str | None
    name: str | None
    body: Any
    at: float

    @property
    def is_watch(self) -> bool:
        return self.verb == "watch"


@dataclass
class _Injection:
    action: Action
    times: int
    verb: str | None
    resource: str | None


@dataclass
class _Event:
    rv: int
    type: str
    obj: dict[str, Any]
    old: dict[str, Any] | None


class _Aborted(Exception):
    """The handler dropped the connection on purpose."""


class _Store:
    """Objects of one resource, keyed by (namespace, name), with their history."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str | None, str], dict[str, Any]] = {}
        self.history: list[_Event] = []


# --------------------------------------------------------------------------- server


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeApiServer


class FakeApiServer:
    """A fake API server on 127.0.0.1; see the module docstring."""

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
        self._injections: list[_Injection] = []
        self._stores = {name: _Store() for name in RESOURCES}
        self._rv = 1
        self._compacted = 0
        self._release_gen = 0
        self._stopping = False
        self._conns: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
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

    def start(self) -> None:
        """Listen (again) on ``self.port``; state and scripts survive a restart."""
        if self._httpd is not None:
            return
        with self._lock:
            self._stopping = False
        httpd = _HTTPServer(("127.0.0.1", self.port), _Handler)
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
            _reset(conn)
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
            self._injections.append(_Injection(action, times, verb, resource))

    def release(self) -> None:
        """End every ``silent`` stream with a clean close."""
        with self._lock:
            self._release_gen += 1
            self._cond.notify_all()

    # ---- cluster state

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self._rv)

    @property
    def compacted_rv(self) -> str:
        with self._lock:
            return str(self._compacted)

    def compact(self, rv: str | int | None = None) -> None:
        """Forget history up to ``rv`` (default: now); older watches get 410."""
        with self._lock:
            point = self._rv if rv is None else int(rv)
            self._compacted = max(self._compacted, point)
            for store in self._stores.values():
                store.history = [e for e in store.history if e.rv > self._compacted]

    def events(self, resource: str = "pods") -> list[dict[str, Any]]:
        """The kept history of one resource as watch events."""
        with self._lock:
            return [
                event(e.type, copy.deepcopy(e.obj))
                for e in self._stores[resource].history
            ]

    def objects(self, resource: str = "pods") -> list[dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(list(self._stores[resource].objects.values()))

    def get(
        self, resource: str, name: str, namespace: str | None = DEFAULT_NAMESPACE
    ) -> dict[str, Any] | None:
        with self._lock:
            obj = self._stores[resource].objects.get(
                self._key(resource, namespace, name)
            )
            return copy.deepcopy(obj)

    def add(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object; returns the stored copy with its new resourceVersion."""
        with self._lock:
            return self._add(resource, obj)

    def modify(
        self,
        resource: str,
        name: str,
        changes: Callable[[dict[str, Any]], Any] | dict[str, Any],
        namespace: str | None = DEFAULT_NAMESPACE,
    ) -> dict[str, Any]:
        """Change an object (callable mutating a copy, or a dict deep-merged)."""
        with self._lock:
            store = self._stores[resource]
            key = self._key(resource, namespace, name)
            if key not in store.objects:
                raise KeyError(f"{resource} {namespace}/{name} does not exist")
            new = copy.deepcopy(store.objects[key])
            if callable(changes):
                changes(new)
            else:
                _merge(new, changes)
            return self._commit(resource, "MODIFIED", new, store.objects[key])

    def delete(
        self, resource: str, name: str, namespace: str | None = DEFAULT_NAMESPACE
    ) -> dict[str, Any]:
        with self._lock:
            store = self._stores[resource]
            key = self._key(resource, namespace, name)
            if key not in store.objects:
                raise KeyError(f"{resource} {namespace}/{name} does not exist")
            old = store.objects[key]
            return self._commit(resource, "DELETED", copy.deepcopy(old), old)

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self.add("pods", pod)

    def add_pods(self, pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        with self._lock:
            return [self._add("pods", pod) for pod in pods]

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
            self.delete("nodes", name, None)
            return self._add("nodes", make_node(name))

    # ---- internals (call with the lock held)

    @staticmethod
    def _key(resource: str, namespace: str | None, name: str):
        return (namespace if RESOURCES[resource][3] else None, name)

    def _add(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        kind, api_version, _, namespaced = RESOURCES[resource]
        obj.setdefault("kind", kind)
        obj.setdefault("apiVersion", api_version)
        if namespaced:
            meta.setdefault("namespace", DEFAULT_NAMESPACE)
        else:
            meta.pop("namespace", None)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", CREATION_TIMESTAMP)
        key = self._key(resource, meta.get("namespace"), meta["name"])
        if key in self._stores[resource].objects:
            raise KeyError(f"{resource} {key} already exists")
        return self._commit(resource, "ADDED", obj, None)

    def _commit(self, resource: str, type_: str, obj, old) -> dict[str, Any]:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        store = self._stores[resource]
        key = self._key(
            resource, obj["metadata"].get("namespace"), obj["metadata"]["name"]
        )
        if type_ == "DELETED":
            store.objects.pop(key, None)
        else:
            store.objects[key] = obj
        store.history.append(_Event(self._rv, type_, obj, old))
        self._cond.notify_all()
        return copy.deepcopy(obj)

    def _record(self, rec: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(rec)
            self._cond.notify_all()

    def _take_action(self, rec: RecordedRequest) -> Action | None:
        with self._lock:
            for inj in self._injections:
                if (inj.verb is None or inj.verb == rec.verb) and (
                    inj.resource is None or inj.resource == rec.resource
                ):
                    inj.times -= 1
                    if inj.times <= 0:
                        self._injections.remove(inj)
                    return inj.action
            for i, action in enumerate(self._queue):
                if action.resource is None or action.resource == rec.resource:
                    return self._queue.pop(i)
            return None


# --------------------------------------------------------------------------- helpers


def _merge(target: dict, changes: dict) -> None:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _reset(conn: socket.socket) -> None:
    """Reset a TCP connection (RST instead of FIN)."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _lookup(obj: dict[str, Any], dotted: str) -> str | None:
    value: Any = obj
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return None if value is None else str(value)


class _BadRequest(Exception):
    pass


def _parse_label_selector(text: str) -> list[tuple[str, str, str | None]]:
    terms: list[tuple[str, str, str | None]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if " in " in raw or " notin " in raw or "(" in raw:
            raise _BadRequest(f"unsupported label selector {raw!r}")
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append(("!=", key.strip(), value.strip()))
        elif "==" in raw or "=" in raw:
            key, value = raw.replace("==", "=").split("=", 1)
            terms.append(("=", key.strip(), value.strip()))
        elif raw.startswith("!"):
            terms.append(("!", raw[1:].strip(), None))
        else:
            terms.append(("exists", raw, None))
    return terms


def _parse_field_selector(text: str) -> list[tuple[str, str, str]]:
    terms: list[tuple[str, str, str]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append(("!=", key.strip(), value.strip()))
        elif "=" in raw:
            key, value = raw.replace("==", "=").split("=", 1)
            terms.append(("=", key.strip(), value.strip()))
        else:
            raise _BadRequest(f"invalid field selector {raw!r}")
    return terms


class _Selector:
    def __init__(self, query: dict[str, str], namespace: str | None) -> None:
        self.namespace = namespace
        self.labels = _parse_label_selector(query.get("labelSelector", ""))
        self.fields = _parse_field_selector(query.get("fieldSelector", ""))

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        for op, key, value in self.labels:
            if op == "exists" and key not in labels:
                return False
            if op == "!" and key in labels:
                return False
            if op == "=" and labels.get(key) != value:
                return False
            if op == "!=" and labels.get(key) == value:
                return False
        for op, key, value in self.fields:
            actual = _lookup(obj, key) or ""
            if (op == "=") != (actual == value):
                return False
        return True


# --------------------------------------------------------------------------- handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.fake._lock:
            self.server.fake._conns.add(self.connection)

    def handle(self) -> None:
        # stop() resets idle keep-alive connections; that is not an error here.
        try:
            super().handle()
        except (OSError, ValueError):
            self.close_connection = True

    def finish(self) -> None:
        with self.server.fake._lock:
            self.server.fake._conns.discard(self.connection)
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

    # ---- routing

    def _dispatch(self) -> None:
        fake = self.server.fake
        parts = urlsplit(self.path)
        query = {
            k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()
        }
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw_body) if raw_body else None
        except ValueError:
            body = raw_body
        resource, namespace, name = _route(parts.path)
        verb = _verb(self.command, name, query) if resource else None
        rec = RecordedRequest(
            self.command,
            parts.path,
            query,
            verb,
            resource,
            namespace,
            name,
            body,
            time.monotonic(),
        )
        fake._record(rec)
        try:
            action = fake._take_action(rec)
            if action is None:
                self._serve_cluster(rec)
            else:
                self._perform(action, rec)
        except _Aborted:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def _perform(self, action: Action, rec: RecordedRequest) -> None:
        if isinstance(action, StatusAction):
            headers = {}
            if action.retry_after is not None:
                headers["Retry-After"] = str(action.retry_after)
            self._send_json(action.code, action.body(), headers)
        elif isinstance(action, JsonAction):
            self._send_json(action.code, action.body, action.headers)
        elif isinstance(action, ListAction):
            body = {
                "kind": action.kind,
                "apiVersion": action.api_version,
                "metadata": {"resourceVersion": str(action.resource_version)},
                "items": action.items,
            }
            if action.continue_token:
                body["metadata"]["continue"] = action.continue_token
            self._send_json(200, body)
        elif isinstance(action, WatchAction):
            self._start_stream()
            for i, ev in enumerate(action.events):
                if i and action.interval:
                    time.sleep(action.interval)
                self._chunk(encode_event(ev))
            last_rv = action.bookmark_rv or _last_rv(action.events) or "1"
            kind = RESOURCES.get(rec.resource or "pods", RESOURCES["pods"])[0]
            self._end_stream(action.end, action, bookmark(last_rv, kind))
        elif isinstance(action, RawAction):
            self._start_stream()
            for i, chunk in enumerate(action.chunks):
                if i and action.interval:
                    time.sleep(action.interval)
                self._chunk(chunk)
            self._end_stream(action.end, None, bookmark("1"))
        elif isinstance(action, ClusterWatch):
            self._serve_cluster(rec, action)
        else:
            raise TypeError(f"unknown action {action!r}")

    # ---- wire helpers

    def _send_json(self, code: int, body: Any, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        if not data:
            return
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _abort(self) -> None:
        self.wfile.flush()
        _reset(self.connection)
        raise _Aborted

    def _end_stream(self, end: str, action: WatchAction | None, bm: dict) -> None:
        fake = self.server.fake
        if end == "drip" and action is not None:
            for _ in range(action.drip_count):
                time.sleep(action.drip_interval)
                self._chunk(encode_event(bm))
            end = "close"
        if end == "silent":
            with fake._cond:
                gen = fake._release_gen
                while not fake._stopping and fake._release_gen == gen:
                    fake._cond.wait(0.5)
                if fake._stopping:
                    end = "abort"
                else:
                    end = "close"
        if end == "truncate":
            data = encode_event(bm)
            self.wfile.write(b"%x\r\n%s" % (len(data), data[: len(data) // 2]))
            self._abort()
        if end == "abort":
            self._abort()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # ---- cluster mode

    def _serve_cluster(self, rec: RecordedRequest, limit: ClusterWatch | None = None):
        fake = self.server.fake
        if rec.resource is None:
            self._send_json(404, status_body(404, message=f"no route for {rec.path}"))
            return
        if rec.verb is None:
            self._send_json(405, status_body(405, message=f"{rec.method} not allowed"))
            return
        try:
            selector = _Selector(rec.query, rec.namespace)
        except _BadRequest as exc:
            self._send_json(400, status_body(400, message=str(exc)))
            return
        if rec.verb == "watch":
            self._cluster_watch(rec, selector, limit)
        elif rec.verb == "list":
            self._cluster_list(rec, selector)
        else:
            with fake._lock:
                code, body = _cluster_write(fake, rec)
            self._send_json(code, body)

    def _cluster_list(self, rec: RecordedRequest, selector: _Selector) -> None:
        fake = self.server.fake
        kind, api_version, _, _ = RESOURCES[rec.resource]
        with fake._lock:
            items = [
                copy.deepcopy(o)
                for _, o in sorted(fake._stores[rec.resource].objects.items(), key=str)
                if selector.matches(o)
            ]
            rv = str(fake._rv)
        start = 0
        if rec.query.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(rec.query["continue"]))
                start, rv = int(token["start"]), token["rv"]
            except (ValueError, KeyError, TypeError):
                self._send_json(400, status_body(400, message="invalid continue token"))
                return
        meta: dict[str, Any] = {"resourceVersion": rv}
        limit = int(rec.query.get("limit") or 0)
        if limit > 0 and start + limit < len(items):
            token = json.dumps({"rv": rv, "start": start + limit}).encode()
            meta["continue"] = base64.urlsafe_b64encode(token).decode()
            meta["remainingItemCount"] = len(items) - start - limit
            items = items[start : start + limit]
        else:
            items = items[start:]
        self._send_json(
            200,
            {
                "kind": f"{kind}List",
                "apiVersion": api_version,
                "metadata": meta,
                "items": items,
            },
        )

    def _cluster_watch(self, rec, selector: _Selector, limit: ClusterWatch | None):
        fake = self.server.fake
        kind, api_version, _, _ = RESOURCES[rec.resource]
        rv_param = rec.query.get("resourceVersion", "")
        timeout = float(rec.query.get("timeoutSeconds") or fake.default_watch_timeout)
        want_bookmarks = rec.query.get("allowWatchBookmarks") in ("true", "1")
        interval = fake.bookmark_interval if want_bookmarks else None
        initial: list[dict[str, Any]] = []
        with fake._lock:
            store = fake._stores[rec.resource]
            current = fake._rv
            if rv_param in ("", "0"):
                # The API server starts such a watch with synthetic ADDED events.
                initial = [
                    event("ADDED", copy.deepcopy(o))
                    for _, o in sorted(store.objects.items(), key=str)
                    if selector.matches(o)
                ]
                pos = current
            else:
                try:
                    pos = int(rv_param)
                except ValueError:
                    msg = f"invalid resource version {rv_param!r}"
                    self._send_json(400, status_body(400, message=msg))
                    return
                if pos > current:
                    action = too_large_rv(pos, current)
                    self._send_json(504, action.body())
                    return
        self._start_stream()
        if pos < int(fake.compacted_rv):
            self._chunk(encode_event(expired(pos, fake.compacted_rv)))
            self._end_stream("close", None, {})
            return
        end = limit.end if limit else "close"
        sent = 0

        def send(ev: dict[str, Any]) -> bool:
            """Write one event; True once the injected event limit is reached."""
            nonlocal sent
            self._chunk(encode_event(ev))
            sent += 1
            return limit is not None and sent >= limit.max_events

        if limit is not None and limit.max_events <= 0:
            self._end_stream(end, None, bookmark(pos, kind, api_version))
            return
        for ev in initial:
            if send(ev):
                self._end_stream(end, None, bookmark(pos, kind, api_version))
                return
        now = time.monotonic()
        deadline = now + timeout
        next_bookmark = now + interval if interval else None
        while True:
            with fake._cond:
                if pos < fake._compacted:
                    batch, gone = [], True
                else:
                    gone = False
                    start = bisect.bisect_right(store.history, pos, key=_event_rv)
                    batch = store.history[start:]
                # Read with the batch: a bookmark must never skip an event that
                # is committed while this thread waits below.
                current = fake._rv
                if not batch and not gone and not fake._stopping:
                    wake = (
                        deadline
                        if next_bookmark is None
                        else min(deadline, next_bookmark)
                    )
                    fake._cond.wait(max(0.0, wake - time.monotonic()))
                    continue_waiting = True
                else:
                    continue_waiting = False
                stopping = fake._stopping
            if stopping:
                self._abort()
            if gone:
                self._chunk(encode_event(expired(pos, fake.compacted_rv)))
                self._end_stream("close", None, {})
                return
            if not continue_waiting:
                for e in batch:
                    ev = _filtered_event(e, selector)
                    pos = e.rv
                    if ev is not None and send(ev):
                        self._end_stream(end, None, bookmark(pos, kind, api_version))
                        return
            now = time.monotonic()
            if next_bookmark is not None and now >= next_bookmark:
                self._chunk(
                    encode_event(bookmark(max(pos, current), kind, api_version))
                )
                pos = max(pos, current)
                next_bookmark = now + interval
            if now >= deadline:
                self._end_stream("close", None, {})
                return


def _event_rv(e: _Event) -> int:
    return e.rv


def _filtered_event(e: _Event, selector: _Selector) -> dict[str, Any] | None:
    """Translate a stored event for one watcher, as the API server's cache does."""
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


def _cluster_write(fake: FakeApiServer, rec: RecordedRequest) -> tuple[int, Any]:
    """Handle get/create/update/delete on a single object (lock held)."""
    resource = rec.resource
    store = fake._stores[resource]
    body = rec.body if isinstance(rec.body, dict) else None
    name = rec.name
    if rec.verb == "create":
        if body is None or not body.get("metadata", {}).get("name"):
            return 400, status_body(400, message="metadata.name is required")
        name = body["metadata"]["name"]
    key = fake._key(resource, rec.namespace, name)
    what = f'{_qualified(resource)} "{name}"'
    details = {"name": name, "group": RESOURCES[resource][2], "kind": resource}
    existing = store.objects.get(key)
    if rec.verb == "create":
        if existing is not None:
            return 409, status_body(
                409, "AlreadyExists", f"{what} already exists", details
            )
        body = copy.deepcopy(body)
        body["metadata"].pop("resourceVersion", None)
        body["metadata"].pop("uid", None)
        if rec.namespace is not None:
            body["metadata"]["namespace"] = rec.namespace
        return 201, fake._add(resource, body)
    if existing is None:
        return 404, status_body(404, "NotFound", f"{what} not found", details)
    if rec.verb == "get":
        return 200, copy.deepcopy(existing)
    if rec.verb == "delete":
        fake._commit(resource, "DELETED", copy.deepcopy(existing), existing)
        ok = status_body(200, "", "", details)
        ok.update(status="Success", code=200)
        return 200, ok
    # update
    if body is None:
        return 400, status_body(400, message="request body is required")
    sent_rv = body.get("metadata", {}).get("resourceVersion")
    if not sent_rv:
        msg = f"{what} is invalid: metadata.resourceVersion: must be specified"
        return 422, status_body(422, "Invalid", msg, details)
    if str(sent_rv) != existing["metadata"]["resourceVersion"]:
        return 409, conflict(name, resource).body()
    new = copy.deepcopy(body)
    for keep in ("uid", "creationTimestamp", "namespace", "name"):
        if keep in existing["metadata"]:
            new["metadata"][keep] = existing["metadata"][keep]
    return 200, fake._commit(resource, "MODIFIED", new, existing)


def _last_rv(events: list[dict[str, Any]]) -> str | None:
    for ev in reversed(events):
        obj = ev.get("object") if isinstance(ev, dict) else None
        rv = (obj or {}).get("metadata", {}).get("resourceVersion")
        if rv:
            return str(rv)
    return None


def _route(path: str) -> tuple[str | None, str | None, str | None]:
    """Map a URL path to (resource, namespace, name)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif parts[:3] == ["apis", "coordination.k8s.io", "v1"]:
        rest = parts[3:]
    else:
        return None, None, None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 2:
        return None, None, None
    resource = rest[0]
    allowed = {"pods", "nodes"} if parts[0] == "api" else {"leases"}
    if resource not in allowed:
        return None, None, None
    if namespace is not None and not RESOURCES[resource][3]:
        return None, None, None
    return resource, namespace, rest[1] if len(rest) == 2 else None


def _verb(method: str, name: str | None, query: dict[str, str]) -> str | None:
    if method == "GET":
        if name is not None:
            return "get"
        return "watch" if query.get("watch") in ("true", "1") else "list"
    if method == "POST" and name is None:
        return "create"
    if method == "PUT" and name is not None:
        return "update"
    if method == "DELETE" and name is not None:
        return "delete"
    return None
