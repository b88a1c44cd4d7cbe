"""`manage.py watch_pods` and history.watcher.process in this process: the command end
to end, `--once`, leadership lost and the namespace option."""

import io
import logging
import signal
import threading
import time

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from history.models import Placement, WatchState
from history.watcher.heartbeat import Heartbeat
from history.watcher.lease import LeaderElector
from history.watcher.process import Watcher
from tests.fakeapi import (
    ClusterWatch,
    make_pod,
    write_kubeconfig,
)
from tests.helpers import watch_once
from tests.watch_streams import (
    NS,
    assert_no_drift,
    counts,
    options,
    pod_stream,
)

pytestmark = pytest.mark.django_db(transaction=True)


def bind_when_watching(server, pod: str, node: str, timeout: float = 10.0) -> None:
    """Bind `pod` to `node` as soon as the watcher has opened its pod watch."""
    deadline = time.monotonic() + timeout
    while not server.watch_requests("pods") and time.monotonic() < deadline:
        time.sleep(0.01)
    server.bind_pod(pod, node)


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
            KSSCHED_WATCHER_METRICS_BIND="",
            KSSCHED_WATCH_READ_TIMEOUT=1.0,
            KSSCHED_WATCH_SERVER_TIMEOUT_MIN=2,
            KSSCHED_WATCH_SERVER_TIMEOUT_MAX=3,
        ):
            # p2 is bound once the watch is open: bound before the list, it would
            # be a list item, and the fourth event would never come.
            threading.Thread(
                target=bind_when_watching, args=(server, "p2", "n1")
            ).start()
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
    took = []
    for bind in ("p1", None):
        started = time.monotonic()
        watch_once(
            server,
            tmp_path,
            KSSCHED_WATCH_SERVER_TIMEOUT_MIN=30,
            KSSCHED_WATCH_SERVER_TIMEOUT_MAX=40,
        )
        took.append(time.monotonic() - started)
        if bind:
            # Bound while no watcher runs: the next --once resumes from the
            # checkpoint and finds the event waiting.
            server.bind_pod(bind, "n2")
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
