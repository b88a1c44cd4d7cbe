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
``/api/v1/nodes[/{name}]``, ``/apis/coordination.k8s.io/v1/leases``,
``/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]`` and
``/apis/events.k8s.io/v1/namespaces/{ns}/events[/{name}]`` (a new Event is validated
as the API server does: ``server.objects("events")`` holds what was accepted).

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

Modules, in the order a request meets them:

- ``server``: ``FakeApiServer``, its lifecycle and the API tests drive;
- ``handler``: the HTTP handler, which records, picks an action or the cluster;
- ``routing``: URL path and method to resource, namespace, name and verb;
- ``actions``: scripted answers and injected faults, and which one a request gets;
- ``selectors``: label and field selectors;
- ``rest``: list, get, create, update and delete served from the store;
- ``watch``: the streaming watch served from the store's history;
- ``responses``: JSON bodies, chunked streams and how a stream ends;
- ``store``: objects, resourceVersions, history and compaction;
- ``objects`` and ``wire``: Pod/Node/Lease builders and pod statuses; Status bodies
  and watch events.

Around it: ``kubeconfig`` writes a kubeconfig that points the kubernetes client at a
server, and ``plugin`` gives tests the ``server`` and ``api`` fixtures (registered
in tests/conftest.py).
"""

from tests.fakeapi.actions import (
    STREAM_ENDINGS,
    Action,
    ClusterWatch,
    JsonAction,
    ListAction,
    RawAction,
    StatusAction,
    WatchAction,
    conflict,
    too_large_rv,
)
from tests.fakeapi.kubeconfig import write_kubeconfig
from tests.fakeapi.objects import (
    CREATION_TIMESTAMP,
    DEFAULT_NAMESPACE,
    PIPELINE_LABEL,
    RESOURCES,
    SCHEDULER_NAME,
    make_lease,
    make_node,
    make_pod,
    pod_status,
)
from tests.fakeapi.routing import RecordedRequest
from tests.fakeapi.server import FakeApiServer
from tests.fakeapi.wire import (
    REASONS,
    bookmark,
    encode_event,
    event,
    expired,
    status_body,
)

__all__ = [
    "CREATION_TIMESTAMP",
    "DEFAULT_NAMESPACE",
    "PIPELINE_LABEL",
    "REASONS",
    "RESOURCES",
    "SCHEDULER_NAME",
    "STREAM_ENDINGS",
    "Action",
    "ClusterWatch",
    "FakeApiServer",
    "JsonAction",
    "ListAction",
    "RawAction",
    "RecordedRequest",
    "StatusAction",
    "WatchAction",
    "bookmark",
    "conflict",
    "encode_event",
    "event",
    "expired",
    "make_lease",
    "make_node",
    "make_pod",
    "pod_status",
    "status_body",
    "too_large_rv",
    "write_kubeconfig",
]
