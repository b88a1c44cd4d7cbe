"""history.watcher.loop: the list/watch loop and the pod handler against the fake API
server over real HTTP.

The unmodified `kubernetes` client talks to tests/fakeapi/; every test checks the
exact counts and that `audit_counts` finds no drift. Process-level behaviour
(signals, restarts, two watchers, locks) is in test_watch_process.py.
"""

import io
import logging
import time
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection

from history import corrections
from history.models import CountAdjustment, KeyNode, Placement, WatchState
from history.watcher import arrivals, kube, metrics
from history.watcher.heartbeat import heartbeat_age
from tests.fakeapi import (
    ClusterWatch,
    ListAction,
    RawAction,
    StatusAction,
    WatchAction,
    bookmark,
    encode_event,
    event,
    expired,
    make_pod,
    write_kubeconfig,
)
from tests.helpers import free_port, placement_counts
from tests.watch_streams import (
    assert_no_drift,
    bound,
    counts,
    pod_stream,
    run_until,
    running,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


# Events


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
        event("DELETED", bound("f", "n3", uid="u-f", label="batch--etl", rv="12")),
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
    # Every (key, node) pair the four pipelines placed count under, segments and
    # label paths.
    assert assert_no_drift() == len(
        placement_counts(
            ("jenkins-go", "n2"),
            ("jenkins-java", "n1"),
            ("web", "n1"),
            ("batch--etl", "n3"),
        )
    )


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
    """Invalid JSON, JSON that is not an event (a list, an event without an object),
    an unknown type, an object without metadata, a blank line."""
    server.script(
        ListAction([], "1"),
        RawAction(
            [
                b"{this is not json\n",
                b"[1, 2]\n",
                b'{"type": "ADDED"}\n',
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
        # The pending pod alone in its watch, so what it wrote can be seen.
        WatchAction([event("MODIFIED", bound("p", "n1", uid="u-p", rv="2"))]),
        WatchAction(
            [
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
    assert stream.watch_once()
    assert stream.resource_version == "2"
    assert Placement.objects.count() == 0
    assert stream.watch_once()
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


# Faults


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


def _spaced(events, gap):
    for item in events:
        time.sleep(gap)
        yield item


def test_events_arriving_within_the_linger_are_written_together():
    """A real API server sends a pod's events one at a time, a few ms apart: those
    that arrive within the linger share one batch (one transaction); without a
    linger each is a batch of its own; the end of the stream does not wait."""
    events = [{"n": n} for n in range(3)]
    started = time.monotonic()
    batches = list(
        arrivals.received_together(_spaced(events, 0.1), lambda: 200, lambda: None, 2.0)
    )
    assert batches == [events]
    assert time.monotonic() - started < 1.5
    batches = list(
        arrivals.received_together(_spaced(events, 0.1), lambda: 200, lambda: None, 0.0)
    )
    assert batches == [[e] for e in events]
    # A batch never takes more than it may.
    batches = list(
        arrivals.received_together(_spaced(events, 0.0), lambda: 2, lambda: None, 2.0)
    )
    assert batches == [events[:2], events[2:]]


def test_an_urgent_event_ends_the_linger():
    """A new placement is written at once (prioritize counts each node's bound
    pods, pod after pod): the batch takes only what had arrived before it."""
    events = [{"n": n} for n in range(3)]
    batches = list(
        arrivals.received_together(
            _spaced(events, 0.1),
            lambda: 200,
            lambda: None,
            2.0,
            urgent=lambda event: event["n"] == 0,
        )
    )
    assert batches == [events[:1], events[1:]]


def test_a_bound_pod_not_yet_in_the_ledger_is_urgent(api, server):
    """Pending pods, bookmarks and later states of a recorded pod may wait; a new
    binding and an unreadable event may not."""
    server.script(ListAction([], "1"))
    stream = pod_stream(api)
    handler = stream.handler
    pending = {"metadata": {"uid": "u-1"}, "spec": {}}
    placed = bound("p", "n1", uid="u-1")
    assert not handler.urgent({"type": "ADDED", "object": pending})
    assert handler.urgent({"type": "MODIFIED", "object": placed})
    assert handler.urgent({"type": "ERROR", "object": {"code": 410}})
    assert handler.urgent("garbage")
    bookmark = {"metadata": {"resourceVersion": "7"}, "kind": "Pod"}
    assert not handler.urgent({"type": "BOOKMARK", "object": bookmark})
    handler._remember("u-1")
    assert not handler.urgent({"type": "MODIFIED", "object": placed})


# No bookmarks and a read timeout past the test's end: nothing but the pods' own
# events ends a batch.
@pytest.mark.parametrize(("bookmark_interval", "read_timeout"), [(None, 120.0)])
def test_a_running_watch_writes_a_new_binding_at_once_and_lets_later_states_wait(
    api, server, monkeypatch
):
    """The stream hands the handler's `urgent` to `received_together`: with a linger
    of minutes, a new binding is in the ledger at once, while the end of a pod
    already recorded waits in its batch until the next binding takes it along."""
    monkeypatch.setattr(arrivals, "LINGER_SECONDS", 300.0)
    server.add_pods([make_pod(name, uid=f"u-{name}", label="k") for name in "ab"])
    stream = pod_stream(api, server_timeout=(300, 300))
    stream.start()
    stream.relist()
    with running(stream):
        server.bind_pod("a", "n1")
        assert wait_until(lambda: Placement.objects.exists()), "waited for the linger"
        server.delete_pod("a")
        # Twenty times the linger a deployment waits: the end is still lingering.
        time.sleep(1.0)
        assert Placement.objects.get(pod_uid="u-a").finished_at is None
        server.bind_pod("b", "n2")
        ended = Placement.objects.filter(pod_uid="u-a", finished_at__isnull=False)
        assert wait_until(ended.exists)
        # Written together, in one transaction.
        assert Placement.objects.filter(pod_uid="u-b", finished_at=None).exists()
    assert counts() == {("k", "n1"): 1, ("k", "n2"): 1}
    assert_no_drift()
