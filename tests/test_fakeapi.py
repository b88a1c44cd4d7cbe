"""Contract tests: the unmodified kubernetes client against tests/fakeapi/.

They pin the client behaviour the watcher relies on (timeouts, 410, bookmarks,
chunked streams). If a client upgrade changes one of these behaviours, these tests
must fail.
"""

import threading
import time

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client import exceptions as kexc

from tests.fakeapi import (
    ClusterWatch,
    ListAction,
    RawAction,
    StatusAction,
    WatchAction,
    bookmark,
    conflict,
    encode_event,
    event,
    expired,
    make_lease,
    make_node,
    make_pod,
    too_large_rv,
)

NS = "ks-pipelines"
SELECTORS = {
    "label_selector": "ks-pipeline",
    "field_selector": "spec.schedulerName=ks-scheduler",
}


@pytest.fixture
def bookmark_interval():
    return 0.2


def api_client(srv, retries=None):
    config = client.Configuration(host=srv.url)
    config.retries = retries
    return client.ApiClient(config)


@pytest.fixture
def core(server):
    with api_client(server) as api:
        yield client.CoreV1Api(api)


def stream(core, **kwargs):
    """Run a watch to its end and return every event the client yielded."""
    kwargs.setdefault("_request_timeout", (2, 5))
    w = watch.Watch()
    return list(w.stream(core.list_pod_for_all_namespaces, **kwargs))


# --------------------------------------------------------------- cluster list/watch


def test_list_honours_selectors_and_kind(server, core):
    server.add_pod(make_pod("a"))
    server.add_pod(make_pod("no-label", label=None))
    server.add_pod(make_pod("other", scheduler="default-scheduler"))
    server.add_pod(make_pod("b", namespace="other-ns"))

    pods = core.list_pod_for_all_namespaces(**SELECTORS, _request_timeout=5)

    assert isinstance(pods, client.V1PodList)
    assert sorted(p.metadata.name for p in pods.items) == ["a", "b"]
    assert pods.metadata.resource_version == server.resource_version
    in_ns = core.list_namespaced_pod(NS, **SELECTORS, _request_timeout=5)
    assert [p.metadata.name for p in in_ns.items] == ["a"]
    query = server.requests[0].query
    assert query["labelSelector"] == "ks-pipeline"
    assert query["fieldSelector"] == "spec.schedulerName=ks-scheduler"


def test_list_with_limit_and_continue(server, core):
    server.add_pods(make_pod(f"p{i}") for i in range(5))

    first = core.list_pod_for_all_namespaces(limit=2, _request_timeout=5)
    names = [p.metadata.name for p in first.items]
    token = first.metadata._continue
    while token:
        page = core.list_pod_for_all_namespaces(
            limit=2, _continue=token, _request_timeout=5
        )
        names += [p.metadata.name for p in page.items]
        token = page.metadata._continue

    assert names == [f"p{i}" for i in range(5)]
    assert first.metadata.remaining_item_count == 3


def test_list_then_watch_streams_live_changes_and_bookmarks(server, core):
    server.add_pod(make_pod("a"))
    rv = core.list_pod_for_all_namespaces(**SELECTORS).metadata.resource_version

    def change():
        time.sleep(0.1)
        server.add_pod(make_pod("b"))
        server.bind_pod("b", "node-1")
        server.add_pod(make_pod("ignored", label=None))

    threading.Thread(target=change).start()
    w = watch.Watch()
    seen = []
    for ev in w.stream(
        core.list_pod_for_all_namespaces,
        **SELECTORS,
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=5,
        _request_timeout=(2, 5),
    ):
        seen.append(ev)
        if ev["type"] == "BOOKMARK" and len(seen) >= 3:
            w.stop()

    types = [(e["type"], _name(e)) for e in seen if e["type"] != "BOOKMARK"]
    assert types == [("ADDED", "b"), ("MODIFIED", "b")]
    assert seen[1]["object"].spec.node_name == "node-1"
    assert isinstance(seen[0]["object"], client.V1Pod)
    last = seen[-1]
    assert last["type"] == "BOOKMARK"
    assert isinstance(last["object"], dict)
    modified_rv = int(seen[1]["object"].metadata.resource_version)
    assert int(last["object"]["metadata"]["resourceVersion"]) >= modified_rv
    assert w.resource_version == last["object"]["metadata"]["resourceVersion"]
    query = server.watch_requests()[0].query
    assert query["watch"] == "true"
    assert query["resourceVersion"] == rv
    assert query["allowWatchBookmarks"] == "true"
    assert query["timeoutSeconds"] == "5"


def test_watch_ends_cleanly_at_timeout_seconds(server, core):
    started = time.monotonic()
    events = stream(core, resource_version=server.resource_version, timeout_seconds=1)
    assert events == []
    assert 0.9 < time.monotonic() - started < 3
    assert len(server.watch_requests()) == 1


def test_watch_replays_history_after_rv(server, core):
    server.add_pod(make_pod("a"))
    after_a = server.resource_version
    server.add_pod(make_pod("b"))
    server.bind_pod("b", "node-1")
    server.delete_pod("a")

    w = watch.Watch()
    seen = []
    for ev in w.stream(
        core.list_pod_for_all_namespaces, resource_version=after_a, timeout_seconds=5
    ):
        seen.append((ev["type"], _name(ev)))
        if len(seen) == 3:
            w.stop()

    assert seen == [("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]


def test_label_removal_is_seen_as_deleted_by_a_selector_watch(server, core):
    server.add_pod(make_pod("a"))
    rv = server.resource_version
    server.modify_pod("a", lambda pod: pod["metadata"]["labels"].pop("ks-pipeline"))

    w = watch.Watch()
    for ev in w.stream(
        core.list_pod_for_all_namespaces, **SELECTORS, resource_version=rv
    ):
        assert (ev["type"], _name(ev)) == ("DELETED", "a")
        w.stop()


def test_compacted_rv_gets_410_error_event(server, core):
    server.add_pod(make_pod("a"))
    old = server.resource_version
    server.add_pod(make_pod("b"))
    server.compact()

    with pytest.raises(kexc.ApiException) as info:
        stream(core, resource_version=old, timeout_seconds=5)
    assert info.value.status == 410
    assert "too old resource version" in info.value.reason
    assert len(server.watch_requests()) == 1


def test_future_rv_gets_504_too_large(server, core):
    future = str(int(server.resource_version) + 100)
    with pytest.raises(kexc.ServiceException) as info:
        stream(core, resource_version=future, timeout_seconds=5)
    assert info.value.status == 504
    assert "Too large resource version" in info.value.body


def test_nodes_list_and_replacement_changes_uid(server, core):
    first = server.add_node(make_node("node-1"))
    nodes = core.list_node(_request_timeout=5)
    assert isinstance(nodes.items[0], client.V1Node)
    rv = nodes.metadata.resource_version

    second = server.replace_node("node-1")

    w = watch.Watch()
    seen = []
    for ev in w.stream(core.list_node, resource_version=rv, timeout_seconds=5):
        seen.append((ev["type"], ev["object"].metadata.uid))
        if len(seen) == 2:
            w.stop()
    assert seen == [
        ("DELETED", first["metadata"]["uid"]),
        ("ADDED", second["metadata"]["uid"]),
    ]


def test_injected_fault_then_cluster_again(server, core):
    server.add_pod(make_pod("a"))
    server.add_pod(make_pod("b"))
    server.inject(ClusterWatch(max_events=1, end="abort"))
    server.inject(StatusAction(500), verb="watch")

    seen = []
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for ev in watch.Watch().stream(
            core.list_pod_for_all_namespaces, resource_version="1", timeout_seconds=5
        ):
            seen.append(_name(ev))
    assert seen == ["a"]
    with pytest.raises(kexc.ServiceException):
        stream(core, resource_version="1", timeout_seconds=5)
    w = watch.Watch()
    for ev in w.stream(
        core.list_pod_for_all_namespaces, resource_version="1", timeout_seconds=5
    ):
        assert _name(ev) == "a"
        w.stop()


def test_restart_keeps_state_and_refuses_while_stopped(server):
    server.add_pod(make_pod("a"))
    port = server.port
    with api_client(server, retries=0) as api:
        core = client.CoreV1Api(api)
        assert len(core.list_pod_for_all_namespaces().items) == 1
        server.stop()
        started = time.monotonic()
        with pytest.raises(urllib3.exceptions.MaxRetryError):
            core.list_pod_for_all_namespaces(_request_timeout=2)
        assert time.monotonic() - started < 1
        server.start()
        assert server.port == port
        assert len(core.list_pod_for_all_namespaces().items) == 1


def test_connection_refused_with_default_retries(server):
    # Configuration.retries None means urllib3's default (3 quick retries).
    server.stop()
    with api_client(server) as api:
        started = time.monotonic()
        with pytest.raises(urllib3.exceptions.MaxRetryError):
            client.CoreV1Api(api).list_pod_for_all_namespaces(_request_timeout=2)
        assert time.monotonic() - started < 2


# --------------------------------------------------------------- scripted streams


def test_bookmark_is_yielded_as_raw_dict(server, core):
    server.script(WatchAction([bookmark("50")]))
    w = watch.Watch()
    events = list(
        w.stream(
            core.list_pod_for_all_namespaces, resource_version="10", timeout_seconds=5
        )
    )
    assert [e["type"] for e in events] == ["BOOKMARK"]
    assert events[0]["object"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "50"},
    }
    assert w.resource_version == "50"


def test_410_event_with_timeout_seconds_raises_at_once(server, core):
    server.script(WatchAction([expired("5")]), WatchAction([]))
    with pytest.raises(kexc.ApiException) as info:
        stream(core, resource_version="5", timeout_seconds=5)
    assert info.value.status == 410
    assert len(server.requests) == 1


def test_410_event_without_timeout_retries_once_from_last_rv(server, core):
    server.script(
        WatchAction([event("ADDED", make_pod("a", rv="10")), expired("5")]),
        WatchAction([expired("10")]),
    )
    with pytest.raises(kexc.ApiException) as info:
        stream(core, resource_version="5")
    assert info.value.status == 410
    assert [r.query["resourceVersion"] for r in server.requests] == ["5", "10"]


def test_clean_close_without_rv_or_events_returns(server, core):
    server.script(WatchAction([]))
    assert stream(core) == []
    assert len(server.requests) == 1


def test_clean_close_without_timeout_reconnects_from_last_rv(server, core):
    server.script(
        WatchAction([event("ADDED", make_pod("a", rv="10"))]),
        WatchAction([event("ADDED", make_pod("b", rv="11"))]),
        StatusAction(500),
    )
    with pytest.raises(kexc.ServiceException):
        stream(core)
    assert [r.query.get("resourceVersion") for r in server.requests] == [
        None,
        "10",
        "11",
    ]


def test_abort_raises_protocol_error(server, core):
    server.script(WatchAction([event("ADDED", make_pod("a", rv="10"))], end="abort"))
    w = watch.Watch()
    seen = []
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for ev in w.stream(core.list_pod_for_all_namespaces, timeout_seconds=5):
            seen.append(ev)
    assert len(seen) == 1


def test_truncated_chunk_raises_protocol_error(server, core):
    server.script(WatchAction([], end="truncate"))
    with pytest.raises(urllib3.exceptions.ProtocolError):
        stream(core, resource_version="1", timeout_seconds=5)


def test_silent_stream_times_out_with_request_timeout(server, core):
    server.script(WatchAction([bookmark("2")], end="silent"))
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        stream(core, resource_version="1", timeout_seconds=5, _request_timeout=(1, 1))
    assert 0.9 < time.monotonic() - started < 2.5


def test_silent_stream_ends_on_release(server, core):
    server.script(WatchAction([], end="silent"))
    threading.Timer(0.3, server.release).start()
    assert stream(core, resource_version="1", timeout_seconds=5) == []


def test_drip_keeps_a_per_read_timeout_from_firing(server, core):
    server.script(WatchAction([], end="drip", drip_count=3, drip_interval=0.5))
    started = time.monotonic()
    events = stream(
        core, resource_version="1", timeout_seconds=5, _request_timeout=(1, 1)
    )
    assert [e["type"] for e in events] == ["BOOKMARK"] * 3
    assert time.monotonic() - started > 1.4


def test_invalid_json_and_blank_line_yield_none(server, core):
    added = encode_event(event("ADDED", make_pod("a", rv="10")))
    server.script(RawAction([b"{not json\n", b"\n", added]))
    events = stream(core, resource_version="1", timeout_seconds=5)
    assert events[:2] == [None, None]
    assert _name(events[2]) == "a"


def test_unknown_event_type_is_passed_through(server, core):
    server.script(RawAction([encode_event(event("FOO", make_pod("a", rv="10")))]))
    events = stream(core, resource_version="1", timeout_seconds=5)
    assert [e["type"] for e in events] == ["FOO"]


def test_split_and_combined_chunks_are_reassembled(server, core):
    one = encode_event(event("ADDED", make_pod("a", rv="10")))
    two = encode_event(event("MODIFIED", make_pod("a", rv="11", node="n1")))
    three = encode_event(event("DELETED", make_pod("a", rv="12", node="n1")))
    server.script(
        RawAction([one[:7], one[7:50], one[50:] + two + three[:5], three[5:]])
    )
    events = stream(core, resource_version="1", timeout_seconds=5)
    assert [(e["type"], e["object"].metadata.resource_version) for e in events] == [
        ("ADDED", "10"),
        ("MODIFIED", "11"),
        ("DELETED", "12"),
    ]


@pytest.mark.parametrize(
    ("action", "exc_type", "status"),
    [
        (StatusAction(403), kexc.ForbiddenException, 403),
        (StatusAction(500), kexc.ServiceException, 500),
        (StatusAction(410), kexc.ApiException, 410),
        (StatusAction(429), kexc.ApiException, 429),
        (too_large_rv(200, 100), kexc.ServiceException, 504),
    ],
)
def test_status_at_connect_raises_typed_exception(
    server, core, action, exc_type, status
):
    server.script(action)
    with pytest.raises(exc_type) as info:
        stream(core, resource_version="1", timeout_seconds=5)
    assert info.value.status == status
    assert '"kind": "Status"' in info.value.body


def test_429_retry_after_is_retried_inside_urllib3_by_default(server, core):
    # With Configuration.retries unset, urllib3's default Retry sleeps for
    # Retry-After and repeats a GET on 429/503 before the caller sees anything.
    server.script(StatusAction(429, retry_after=1), WatchAction([bookmark("7")]))
    started = time.monotonic()
    events = stream(core, resource_version="1", timeout_seconds=5)
    assert [e["type"] for e in events] == ["BOOKMARK"]
    assert len(server.requests) == 2
    assert time.monotonic() - started >= 0.9


def test_429_retry_after_reaches_caller_with_retries_off(server):
    server.script(StatusAction(429, retry_after=3))
    with api_client(server, retries=0) as api:
        with pytest.raises(kexc.ApiException) as info:
            stream(client.CoreV1Api(api), resource_version="1", timeout_seconds=5)
    assert info.value.status == 429
    assert info.value.headers["Retry-After"] == "3"
    assert len(server.requests) == 1


def test_scripted_list_deserializes(server, core):
    server.script(ListAction([make_pod("a", rv="7")], resource_version="9"))
    pods = core.list_pod_for_all_namespaces(_request_timeout=5)
    assert pods.metadata.resource_version == "9"
    assert pods.items[0].metadata.labels["ks-pipeline"] == "pipeline1"


# --------------------------------------------------------------- leases


def test_lease_create_get_replace_and_conflicts(server):
    with api_client(server) as api:
        coord = client.CoordinationV1Api(api)
        created = coord.create_namespaced_lease(NS, make_lease("leader", "w-1"))
        assert created.metadata.resource_version == server.resource_version
        with pytest.raises(kexc.ConflictException) as dup:
            coord.create_namespaced_lease(NS, make_lease("leader", "w-2"))
        assert '"AlreadyExists"' in dup.value.body

        lease = coord.read_namespaced_lease("leader", NS)
        assert lease.spec.holder_identity == "w-1"
        lease.spec.holder_identity = "w-2"
        updated = coord.replace_namespaced_lease("leader", NS, lease)
        assert updated.spec.holder_identity == "w-2"
        assert updated.metadata.uid == created.metadata.uid

        lease.spec.holder_identity = "w-3"  # still carries the old RV
        with pytest.raises(kexc.ConflictException) as stale:
            coord.replace_namespaced_lease("leader", NS, lease)
        assert '"Conflict"' in stale.value.body
        assert coord.read_namespaced_lease("leader", NS).spec.holder_identity == "w-2"

        with pytest.raises(kexc.NotFoundException):
            coord.read_namespaced_lease("missing", NS)


def test_lease_scripted_conflict(server):
    with api_client(server) as api:
        coord = client.CoordinationV1Api(api)
        coord.create_namespaced_lease(NS, make_lease("leader", "w-1"))
        server.inject(conflict("leader"), verb="update", resource="leases")
        lease = coord.read_namespaced_lease("leader", NS)
        with pytest.raises(kexc.ConflictException):
            coord.replace_namespaced_lease("leader", NS, lease)
        assert coord.replace_namespaced_lease("leader", NS, lease).metadata.name


def _name(ev):
    return ev["object"].metadata.name


def test_watch_without_rv_starts_with_synthetic_added(server, core):
    server.add_pod(make_pod("a"))
    server.add_pod(make_pod("b", label=None))
    w = watch.Watch()
    for ev in w.stream(core.list_pod_for_all_namespaces, **SELECTORS):
        assert (ev["type"], _name(ev)) == ("ADDED", "a")
        w.stop()
    assert "resourceVersion" not in server.requests[0].query


def test_stopping_the_server_resets_a_live_watch(server, core):
    threading.Timer(0.3, server.stop).start()
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ProtocolError):
        stream(core, resource_version=server.resource_version, timeout_seconds=5)
    assert time.monotonic() - started < 2
