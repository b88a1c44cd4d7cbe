"""The watcher's list/watch loop, pod and node handlers and lease against the fake
API server over real HTTP.

The unmodified `kubernetes` client talks to tests/fakeapi/; every test checks the
exact counts and that `audit_counts` finds no drift. Process-level behaviour
(signals, restarts, two watchers, locks) is in test_watch_process.py.
"""

import io
import logging
import signal
import threading
import time
from contextlib import contextmanager

import pytest
import urllib3
from django.core.management import call_command
from django.db import OperationalError, connection
from django.test import override_settings

from history import audit, corrections
from history.models import CountAdjustment, KeyNode, NodeRecord, Placement, WatchState
from history.watcher import kube, metrics, state
from history.watcher.heartbeat import Heartbeat, heartbeat_age
from history.watcher.lease import LeaderElector
from history.watcher.loop import Stream
from history.watcher.nodes import NodeHandler
from history.watcher.options import Backoff, Options
from history.watcher.pods import PodHandler
from history.watcher.process import Watcher
from tests.fakeapi import (
    ClusterWatch,
    FakeApiServer,
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
)
from tests.helpers import free_port
from tests.soak_watch import write_kubeconfig

pytestmark = pytest.mark.django_db(transaction=True)

NS = "ks-pipelines"


@pytest.fixture
def server():
    with FakeApiServer(bookmark_interval=0.3) as fake:
        yield fake


@pytest.fixture
def api(server, tmp_path):
    client = kube.api_client(kubeconfig=str(write_kubeconfig(tmp_path, server.url)))
    return kube.KubeApi(client, connect_timeout=1, read_timeout=1.0)


def options(**overrides):
    values = dict(
        scheduler_name="ks-scheduler",
        pipeline_label="ks-pipeline",
        server_timeout=(2, 3),
        backoff_base=0.05,
        backoff_cap=0.3,
        backoff_reset=5,
    )
    values.update(overrides)
    return Options(**values)


def pod_stream(api, tmp_path=None, **overrides):
    heartbeat = Heartbeat(tmp_path / "hb" if tmp_path else None)
    opts = options(**overrides)
    return Stream(api, PodHandler(opts), options=opts, heartbeat=heartbeat)


def counts():
    return {(k.key, k.node): k.count for k in KeyNode.objects.all() if k.count}


def assert_no_drift():
    checked, drifts = audit.audit_counts()
    assert drifts == []
    return checked


def bound(name, node, uid=None, label="pipeline1", rv="1", **kw):
    return make_pod(name, uid=uid, node=node, label=label, rv=rv, **kw)


def run_until(stream, predicate, timeout=10.0):
    """Run stream.run() in a thread until predicate() holds; then stop it."""
    errors = []

    def target():
        try:
            stream.run()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    reached = predicate()
    stream.shutdown.set()
    stream.interrupt()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert errors == []
    return reached


# --------------------------------------------------------------------------- events


def test_duplicates_out_of_order_replays_and_noise_count_each_uid_once(api, server):
    """Duplicates, replays of older states, other schedulers, unlabelled pods,
    a name reused by a new UID and a pod seen only at deletion: one count per bound
    pipeline pod UID, whatever the order."""
    api_server_events = [
        event("ADDED", make_pod("b", uid="u-b", label="jenkins-java", rv="3")),
        event("MODIFIED", bound("b", "n1", uid="u-b", label="jenkins-java", rv="4")),
        event("MODIFIED", bound("b", "n1", uid="u-b", label="jenkins-java", rv="5")),
        event("MODIFIED", bound("a", "n2", uid="u-a", label="jenkins-go", rv="6")),
        # An older state replayed after a newer one.
        event("MODIFIED", bound("b", "n1", uid="u-b", label="jenkins-java", rv="4")),
        event("ADDED", bound("c", "n1", uid="u-c", scheduler="default-scheduler")),
        event("ADDED", bound("d", "n1", uid="u-d", label=None, rv="8")),
        event("ADDED", bound("web-0", "n1", uid="u-e1", label="web", rv="9")),
        event("DELETED", bound("web-0", "n1", uid="u-e1", label="web", rv="10")),
        event("ADDED", bound("web-0", "n1", uid="u-e2", label="web", rv="11")),
        # Seen only at deletion (bound and deleted while disconnected).
        event("DELETED", bound("f", "n3", uid="u-f", label="batch--etl-", rv="12")),
        bookmark("20"),
        event("DELETED", bound("b", "n1", uid="u-b", label="jenkins-java", rv="21")),
    ]
    stream = pod_stream(api)
    server.script(
        ListAction([make_pod("a", uid="u-a", label="jenkins-go", rv="2")], "2"),
        WatchAction(api_server_events),
    )
    stream.start()
    assert stream.needs_list
    assert stream.watch_once() is True
    assert counts() == {
        ("jenkins", "n1"): 1,
        ("java", "n1"): 1,
        ("jenkins", "n2"): 1,
        ("go", "n2"): 1,
        ("web", "n1"): 2,
        ("batch", "n3"): 1,
        ("etl", "n3"): 1,
    }
    assert Placement.objects.count() == 5
    ended = set(
        Placement.objects.filter(finished_at__isnull=False).values_list(
            "pod_uid", flat=True
        )
    )
    assert ended == {"u-b", "u-e1", "u-f"}
    state = WatchState.objects.get(name="pods")
    assert state.resource_version == "21"
    assert state.relists == 1
    assert state.events == 12
    assert state.heartbeat_at is not None
    watch = server.watch_requests("pods")[0]
    assert watch.query["resourceVersion"] == "2"
    assert watch.query["allowWatchBookmarks"] == "true"
    assert watch.query["labelSelector"] == "ks-pipeline"
    assert watch.query["fieldSelector"] == "spec.schedulerName=ks-scheduler"
    assert 2 <= int(watch.query["timeoutSeconds"]) <= 3
    assert assert_no_drift() == 7


def test_label_edited_after_binding_changes_nothing(api, server):
    """The key is frozen at first observation; removing the label is not an end."""
    server.script(
        ListAction([], "1"),
        WatchAction(
            [
                event("ADDED", bound("p", "n1", uid="u-p", label="k1", rv="2")),
                event("MODIFIED", bound("p", "n1", uid="u-p", label="k2-x", rv="3")),
                event("DELETED", bound("p", "n1", uid="u-p", label=None, rv="4")),
            ]
        ),
    )
    stream = pod_stream(api)
    stream.start()
    assert stream.watch_once()
    assert counts() == {("k1", "n1"): 1}
    placement = Placement.objects.get()
    assert (placement.label, placement.finished_at) == ("k1", None)
    assert_no_drift()


def test_unreadable_and_unknown_events_are_logged_and_skipped(api, server, caplog):
    """Invalid JSON, an unknown type, an object without metadata, a blank line."""
    server.script(
        ListAction([], "1"),
        RawAction(
            [
                b"{this is not json\n",
                encode_event({"type": "FOO", "object": {"kind": "Pod"}}),
                encode_event(event("ADDED", {"kind": "Pod"})),
                b"\n",
                encode_event(event("ADDED", bound("ok", "n1", uid="u-ok", rv="5"))),
            ]
        ),
    )
    stream = pod_stream(api)
    stream.start()
    with caplog.at_level(logging.WARNING, logger="history.watcher"):
        assert stream.watch_once()
    assert counts() == {("pipeline1", "n1"): 1}
    text = caplog.text
    assert "Skipping unreadable pods watch event" in text
    assert "Skipping unexpected pods watch event (type 'FOO'" in text
    assert WatchState.objects.get(name="pods").resource_version == "5"
    assert_no_drift()


def test_count_when_running_waits_for_the_running_phase(api, server):
    server.script(
        ListAction([], "1"),
        WatchAction(
            [
                event("MODIFIED", bound("p", "n1", uid="u-p", rv="2")),
                event("MODIFIED", bound("p", "n1", uid="u-p", rv="3", phase="Running")),
                event("MODIFIED", bound("q", "n2", uid="u-q", rv="4", phase="Failed")),
                event(
                    "MODIFIED", bound("p", "n1", uid="u-p", rv="5", phase="Succeeded")
                ),
            ]
        ),
    )
    stream = pod_stream(api, count_when="running")
    stream.start()
    after_pending = None

    def spy(raw, original=stream.handle):
        nonlocal after_pending
        original(raw)
        if raw["object"]["metadata"]["resourceVersion"] == "2":
            after_pending = Placement.objects.count()

    stream.handle = spy
    assert stream.watch_once()
    assert after_pending == 0
    assert counts() == {("pipeline1", "n1"): 1}
    assert Placement.objects.get().finished_at is not None
    assert_no_drift()


def test_a_rolled_back_attempt_is_not_counted_in_the_metrics(api, server):
    """A database error after the placement was written rolls the attempt back; the
    retry records it again, and the placement metric counts it once."""
    server.script(
        ListAction([], "1"),
        WatchAction([event("ADDED", bound("p", "n1", uid="u-p", rv="2"))]),
    )
    stream = pod_stream(api)
    stream.start()
    stream.relist()
    failed = []

    def fail_first_checkpoint(execute, sql, params, many, context):
        # The checkpoint is saved after the placement, in the same transaction.
        if not failed and sql.startswith('UPDATE "history_watchstate"'):
            if params and "2" in params:
                failed.append(sql)
                raise OperationalError("database is locked")
        return execute(sql, params, many, context)

    recorded = metrics.PLACEMENTS_RECORDED._value.get()
    retries = metrics.DB_RETRIES._value.get()
    with connection.execute_wrapper(fail_first_checkpoint):
        assert stream.watch_once()
    assert failed
    assert metrics.DB_RETRIES._value.get() == retries + 1
    assert metrics.PLACEMENTS_RECORDED._value.get() == recorded + 1
    assert counts() == {("pipeline1", "n1"): 1}
    assert WatchState.objects.get(name="pods").resource_version == "2"
    assert_no_drift()


@contextmanager
def unwritable_pod(uid, label, node):
    """Make the placement of pod `uid` fail with a data error on every attempt.

    PostgreSQL: the count of (label, node) is at the bigint maximum (written before
    counts were bounded, or by hand in SQL), so the next increment is out of range.
    SQLite has no such limit (it turns to a float), so a trigger rejects the ledger
    row instead.
    """
    if connection.vendor == "postgresql":
        corrections.create_key_node(key=label, node=node, count=1, actor="ops")
        huge = 2**63 - 1
        KeyNode.objects.filter(key=label, node=node).update(count=huge)
        CountAdjustment.objects.create(
            key=label, node=node, delta=huge - 1, reason="admin_edit", actor="ops"
        )
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TRIGGER reject_pod BEFORE INSERT ON history_placement "
            f"WHEN NEW.pod_uid = '{uid}' BEGIN SELECT RAISE(ABORT, 'rejected'); END"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS reject_pod")


def test_an_event_that_can_never_be_written_is_skipped_and_reported(
    api, server, caplog
):
    """A data error on every attempt: the event is logged, counted and recorded as
    skipped after a few attempts, and the pods after it are counted."""
    server.script(
        ListAction([], "1"),
        WatchAction(
            [
                event("ADDED", bound("bad", "n9", uid="u-bad", label="max", rv="2")),
                event("ADDED", bound("ok", "n1", uid="u-ok", label="fine", rv="3")),
            ]
        ),
    )
    stream = pod_stream(api)
    stream.start()
    skipped = metrics.EVENTS_SKIPPED.labels("pods")._value.get()
    with (
        unwritable_pod("u-bad", "max", "n9"),
        caplog.at_level(logging.WARNING, logger="history.watcher"),
    ):
        assert run_until(stream, lambda: Placement.objects.count() == 1)
    assert list(Placement.objects.values_list("pod_uid", flat=True)) == ["u-ok"]
    watch_state = WatchState.objects.get(name="pods")
    assert watch_state.resource_version == "3"
    assert watch_state.skipped_events == 1
    assert "u-bad" in watch_state.last_skipped
    assert "rv=2" in watch_state.last_skipped
    assert watch_state.last_skipped_at is not None
    assert metrics.EVENTS_SKIPPED.labels("pods")._value.get() == skipped + 1
    if connection.vendor == "postgresql":
        assert "DataError: bigint out of range" in watch_state.last_skipped
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "u-bad" in errors[0].getMessage()
    assert "ks-pipelines/bad" in errors[0].getMessage()
    assert_no_drift()


def test_watcher_health_shows_skipped_events(tmp_path):
    heartbeat = tmp_path / "hb"
    heartbeat.touch()
    out = io.StringIO()
    call_command("watcher_health", path=str(heartbeat), stdout=out)
    assert "skipped" not in out.getvalue()
    WatchState.objects.create(
        name="pods", skipped_events=3, last_skipped="ADDED pods ci/p uid=u-1 rv=7: x"
    )
    out = io.StringIO()
    call_command("watcher_health", path=str(heartbeat), stdout=out)
    assert out.getvalue().startswith("ok: heartbeat")
    assert "pods: 3 events skipped, last: ADDED pods ci/p uid=u-1 rv=7: x" in (
        out.getvalue()
    )


def test_a_listed_pod_that_cannot_be_written_is_skipped_alone(api, server):
    """A data error in a list batch: the other pods of the batch are still counted."""
    server.add_pods(
        [
            bound("a", "n1", uid="u-a", label="fine"),
            bound("bad", "n9", uid="u-bad", label="max"),
            bound("c", "n2", uid="u-c", label="fine"),
        ]
    )
    server.inject(ClusterWatch(max_events=0, end="close"))
    stream = pod_stream(api)
    stream.start()
    with unwritable_pod("u-bad", "max", "n9"):
        assert run_until(stream, lambda: Placement.objects.count() == 2)
    assert set(Placement.objects.values_list("pod_uid", flat=True)) == {"u-a", "u-c"}
    assert WatchState.objects.get(name="pods").skipped_events == 1


def test_a_locked_database_is_retried_until_it_answers(api, server):
    """Transient errors are never skipped, however many attempts they take."""
    server.script(
        ListAction([], "1"),
        WatchAction([event("ADDED", bound("p", "n1", uid="u-p", rv="2"))]),
    )
    stream = pod_stream(api)
    stream.start()
    stream.relist()
    failures = []

    def locked_five_times(execute, sql, params, many, context):
        if len(failures) < 5 and sql.startswith('INSERT INTO "history_placement"'):
            failures.append(sql)
            raise OperationalError("database is locked")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(locked_five_times):
        assert stream.watch_once()
    assert len(failures) == 5
    assert counts() == {("pipeline1", "n1"): 1}
    assert WatchState.objects.get(name="pods").skipped_events == 0


# --------------------------------------------------------------------------- faults


def test_410_then_relist_and_resume_after_compaction(api, server):
    """An ERROR 410 event relists; a checkpoint the server compacted away relists
    too, after a restart."""
    server.add_pods([make_pod(f"p{i}", label="a-b") for i in range(3)])
    server.bind_pod("p0", "n1")
    stream = pod_stream(api)
    stream.start()
    server.inject(WatchAction([expired(1, 50)]))
    assert stream.watch_once() is False  # 410 with nothing delivered: back off
    assert stream.needs_list
    server.bind_pod("p1", "n2")
    server.inject(ClusterWatch(max_events=0, end="close"))
    stream.watch_once()
    assert counts() == {("a", "n1"): 1, ("b", "n1"): 1, ("a", "n2"): 1, ("b", "n2"): 1}
    assert WatchState.objects.get(name="pods").relists == 2

    # The process goes away; the API server compacts its history meanwhile.
    server.bind_pod("p2", "n1")
    server.compact()
    restarted = pod_stream(api)
    restarted.start()
    assert not restarted.needs_list  # resumes from the saved checkpoint
    assert restarted.watch_once() is False  # the checkpoint is gone: 410
    server.inject(ClusterWatch(max_events=0, end="close"))
    restarted.watch_once()
    assert counts() == {("a", "n1"): 2, ("b", "n1"): 2, ("a", "n2"): 1, ("b", "n2"): 1}
    assert WatchState.objects.get(name="pods").relists == 3
    assert_no_drift()


def test_dropped_and_truncated_streams_resume_from_the_same_rv(api, server):
    """A dropped or truncated stream needs no relist: the next watch starts at the
    last committed event."""
    server.add_pods([make_pod(f"p{i}", label="k") for i in range(6)])
    stream = pod_stream(api)
    stream.start()
    stream.relist()
    server.inject(ClusterWatch(max_events=2, end="abort"))
    server.inject(ClusterWatch(max_events=1, end="truncate"))
    for i in range(6):
        server.bind_pod(f"p{i}", f"n{i % 2}")

    assert run_until(stream, lambda: Placement.objects.count() == 6)
    assert counts() == {("k", "n0"): 3, ("k", "n1"): 3}
    watches = server.watch_requests("pods")
    assert len(watches) >= 3
    list_rv = int(watches[0].query["resourceVersion"])
    assert [int(w.query["resourceVersion"]) for w in watches[:3]] == [
        list_rv,
        list_rv + 2,
        list_rv + 3,
    ]
    state = WatchState.objects.get(name="pods")
    assert state.relists == 1
    assert_no_drift()


def test_silent_server_past_the_read_timeout_reconnects(api, server):
    """A stream that says nothing is abandoned after the read timeout."""
    server.add_pod(make_pod("p", label="k"))
    stream = pod_stream(api)
    stream.start()
    server.inject(WatchAction([], end="silent"))
    before = metrics.RECONNECTS.labels("read_timeout")._value.get()
    started = time.monotonic()
    assert stream.watch_once() is False
    assert 0.9 < time.monotonic() - started < 5
    assert metrics.RECONNECTS.labels("read_timeout")._value.get() == before + 1
    server.bind_pod("p", "n1")
    assert run_until(stream, lambda: Placement.objects.count() == 1)
    assert counts() == {("k", "n1"): 1}
    assert_no_drift()


def test_an_unreachable_server_logs_one_short_line_per_attempt(tmp_path, caplog):
    """No client-side retries behind the loop's back, no second line for the
    backoff: one short WARNING per connection attempt."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = kube.api_client(kubeconfig=str(write_kubeconfig(tmp_path, url)))
    stream = pod_stream(kube.KubeApi(client, connect_timeout=1, read_timeout=1.0))
    stream.needs_list = True
    attempts = metrics.RECONNECTS.labels("unreachable")
    before = attempts._value.get()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        run_until(stream, lambda: attempts._value.get() >= before + 3)
    tried = attempts._value.get() - before
    assert tried >= 3
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.name for r in lines] == ["history.watcher.loop"] * int(tried)
    for line in lines:
        message = line.getMessage()
        assert message.startswith("The pods watch failed (unreachable): ")
        assert message.endswith("Connection refused; listing again")
        assert len(message) < 200, message


def test_persistent_500_is_retried_at_a_bounded_rate(api, server):
    """Every failure backs off; the request rate stays bounded."""
    server.inject(StatusAction(500), times=10_000, verb="watch")
    stream = pod_stream(api, backoff_base=0.2, backoff_cap=0.4)
    stream.start()
    started = time.monotonic()
    run_until(stream, lambda: time.monotonic() - started > 2.5)
    watches = len(server.watch_requests("pods"))
    # With a 0.2 s minimum delay at most ~13 requests fit into 2.5 s.
    assert 3 <= watches <= 13
    assert Placement.objects.count() == 0


def test_heartbeat_moves_on_events_and_backoff(api, server, tmp_path):
    stream = pod_stream(api, tmp_path)
    stream.start()
    server.inject(StatusAction(503), times=3, verb="watch")
    started = time.time()
    run_until(stream, lambda: time.time() - started > 0.6)
    age = heartbeat_age(tmp_path / "hb")
    assert age is not None and age < 1.5


# --------------------------------------------------------------------------- nodes


def test_node_stream_notices_a_replaced_node(api, server):
    server.add_node(make_node("n1", uid="uid-1"))
    server.add_node(make_node("n2", uid="uid-2"))
    nodes = Stream(api, NodeHandler(), options=options())
    nodes.start()
    nodes.relist()
    server.replace_node("n1")
    server.modify("nodes", "n2", {"status": {"phase": "Running"}}, None)
    assert run_until(nodes, lambda: NodeRecord.objects.filter(replacements=1).exists())
    n1 = NodeRecord.objects.get(name="n1")
    assert n1.uid != "uid-1" and n1.history_since is not None
    n2 = NodeRecord.objects.get(name="n2")
    assert (n2.uid, n2.replacements, n2.history_since) == ("uid-2", 0, None)


def test_record_node_seen_outcomes():
    assert state.record_node_seen(name="x", uid="1") == "new"
    assert state.record_node_seen(name="x", uid="1") == "same"
    assert state.record_node_seen(name="x", uid="2") == "replaced"
    record = NodeRecord.objects.get(name="x")
    assert (record.uid, record.replacements) == ("2", 1)


# --------------------------------------------------------------------------- leases


def test_lease_acquire_renew_release_and_conflict(api, server):
    first = LeaderElector(api, "lease", NS, "a", duration=2)
    second = LeaderElector(api, "lease", NS, "b", duration=2)
    assert first.try_acquire()
    assert not second.try_acquire()
    assert first.try_acquire()  # renew
    server.inject(conflict("lease"), verb="update", resource="leases")
    assert not first.try_acquire()
    first.release()
    assert second.try_acquire()
    lease = server.get("leases", "lease", NS)
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1


def test_an_expired_lease_is_taken_over(api, server):
    server.add("leases", make_lease("lease", holder="gone", duration=1))
    elector = LeaderElector(api, "lease", NS, "me", duration=2)
    assert not elector.try_acquire()
    time.sleep(1.2)
    assert elector.try_acquire()
    assert server.get("leases", "lease", NS)["spec"]["holderIdentity"] == "me"


# --------------------------------------------------------------------------- units


def test_backoff_grows_is_capped_and_resets():
    now = [0.0]
    backoff = Backoff(
        base=0.8, cap=30, reset=120, rng=lambda: 0.5, clock=lambda: now[0]
    )
    delays = [backoff.next_delay() for _ in range(8)]
    assert delays[:3] == pytest.approx([1.2, 2.4, 4.8])
    assert max(delays) == 30 and min(delays) >= 0.8
    now[0] = 500.0
    assert backoff.next_delay() == pytest.approx(1.2)


def test_classify_sorts_client_errors():
    from kubernetes.client.exceptions import ApiException

    assert kube.classify(ApiException(status=410)).action == kube.GONE
    too_large = ApiException(status=504, reason="Too large resource version: 9")
    assert kube.classify(too_large).action == kube.GONE
    assert kube.classify(ApiException(status=429)).reason == "429"
    assert kube.classify(ValueError("x")) is None
    pool = urllib3.HTTPConnectionPool("api.example", 6443)
    url = "/api/v1/pods?labelSelector=ks-pipeline&limit=500"
    refused = urllib3.exceptions.NewConnectionError(pool, "Connection refused")
    failure = kube.classify(urllib3.exceptions.MaxRetryError(pool, url, refused))
    assert (failure.reason, failure.detail) == ("unreachable", str(refused))
    slow = urllib3.exceptions.ReadTimeoutError(pool, url, "Read timed out.")
    failure = kube.classify(urllib3.exceptions.MaxRetryError(pool, url, slow))
    assert failure.reason == "read_timeout"


# --------------------------------------------------------------------------- command


def test_watch_pods_command_end_to_end_with_max_events(server, tmp_path):
    server.add_pods([make_pod(f"p{i}", label="e2e-k") for i in range(3)])
    server.bind_pod("p0", "n1")
    server.bind_pod("p1", "n2")
    kubeconfig = write_kubeconfig(tmp_path, server.url)
    heartbeat = tmp_path / "heartbeat"
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with override_settings(
            KSSCHED_HEARTBEAT_PATH=str(heartbeat),
            KSSCHED_WATCHER_METRICS_PORT=0,
            KSSCHED_WATCH_READ_TIMEOUT=1.0,
            KSSCHED_WATCH_SERVER_TIMEOUT_MIN=2,
            KSSCHED_WATCH_SERVER_TIMEOUT_MAX=3,
        ):
            threading.Timer(0.5, server.bind_pod, ("p2", "n1")).start()
            call_command(
                "watch_pods",
                kubeconfig=str(kubeconfig),
                max_events=4,
                no_nodes=True,
                stdout=io.StringIO(),
            )
            call_command("watcher_health", stdout=io.StringIO())
            with pytest.raises(SystemExit) as stale:
                time.sleep(0.05)
                call_command("watcher_health", max_age=0.01, stderr=io.StringIO())
            assert stale.value.code == 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert counts() == {
        ("e2e", "n1"): 2,
        ("k", "n1"): 2,
        ("e2e", "n2"): 1,
        ("k", "n2"): 1,
    }
    out = io.StringIO()
    call_command("audit_counts", stdout=out)
    assert "no drift" in out.getvalue()


def test_watch_pods_once_returns_after_the_list_and_the_queued_events(server, tmp_path):
    """--once does not wait for the server's watch timeout (here 30-40 s)."""
    server.add_pods([make_pod(f"p{i}", label="once") for i in range(2)])
    server.bind_pod("p0", "n1")
    kubeconfig = str(write_kubeconfig(tmp_path, server.url))
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    took = []
    try:
        with override_settings(
            KSSCHED_HEARTBEAT_PATH=str(tmp_path / "hb"),
            KSSCHED_WATCHER_METRICS_PORT=0,
            KSSCHED_WATCH_SERVER_TIMEOUT_MIN=30,
            KSSCHED_WATCH_SERVER_TIMEOUT_MAX=40,
        ):
            for bind in ("p1", None):
                started = time.monotonic()
                call_command(
                    "watch_pods",
                    kubeconfig=kubeconfig,
                    once=True,
                    no_nodes=True,
                    stdout=io.StringIO(),
                )
                took.append(time.monotonic() - started)
                if bind:
                    # Bound while no watcher runs: the next --once resumes from the
                    # checkpoint and finds the event waiting.
                    server.bind_pod(bind, "n2")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert max(took) < 5, took
    assert counts() == {("once", "n1"): 1, ("once", "n2"): 1}
    assert WatchState.objects.get(name="pods").relists == 1
    assert_no_drift()


def test_a_leader_that_loses_its_lease_stops_watching_and_stands_by(
    api, server, tmp_path, caplog
):
    """Renewal fails past the deadline: the watch stops and the replica waits."""
    elector = LeaderElector(
        api, "lease", NS, "me", duration=2, renew_deadline=0.6, retry_period=0.2
    )
    watcher = Watcher(
        api,
        options=options(),
        heartbeat=Heartbeat(tmp_path / "hb"),
        watch_nodes=False,
        elector=elector,
    )
    thread = threading.Thread(target=_run_and_close, args=(watcher,), daemon=True)
    with caplog.at_level(logging.INFO, logger="history.watcher"):
        thread.start()
        assert _wait(lambda: server.watch_requests("pods"))
        assert WatchState.objects.get(name="pods").holder == "me"

        def steal(lease):
            lease["spec"]["holderIdentity"] = "other"
            lease["spec"]["leaseDurationSeconds"] = 60

        server.modify("leases", "lease", steal, NS)
        stolen_at = time.monotonic()
        assert _wait(lambda: "Lost the lease; standing by" in caplog.text)
        assert time.monotonic() - stolen_at < 2.5
        watches = len(server.watch_requests("pods"))
        server.add_pod(make_pod("late", node="n1", label="k"))
        time.sleep(0.5)
        assert len(server.watch_requests("pods")) == watches
        assert Placement.objects.count() == 0
        watcher.request_shutdown()
        thread.join(timeout=10)
    assert not thread.is_alive()
    # The other holder's lease is left alone on shutdown.
    assert server.get("leases", "lease", NS)["spec"]["holderIdentity"] == "other"


def _run_and_close(watcher):
    try:
        watcher.run()
    finally:
        connection.close()


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_namespace_option_lists_and_watches_one_namespace(api, server):
    server.add_pod(make_pod("mine", namespace="team-a", node="n1", label="ns-a"))
    server.add_pod(make_pod("theirs", namespace="team-b", node="n1", label="ns-b"))
    stream = pod_stream(api, namespace="team-a")
    stream.start()
    server.inject(ClusterWatch(max_events=0, end="close"))
    stream.watch_once()
    assert counts() == {("ns", "n1"): 1, ("a", "n1"): 1}
    paths = {r.path for r in server.requests if r.resource == "pods"}
    assert paths == {"/api/v1/namespaces/team-a/pods"}
