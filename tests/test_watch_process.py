"""`manage.py watch_pods` as a real subprocess: signals, restarts, two watchers,
leader election, a held database lock and a small scripted run with faults.

Each test ends with exact counts and an audit without drift.
"""

import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from history import audit
from history.models import Placement, WatchState
from tests.fakeapi import make_pod, write_kubeconfig
from tests.helpers import REPO, database_env, free_port
from tests.watcher_process import (
    WatcherProcess,
    expected_counts,
    hold_write_lock,
    stored_counts,
    wait_until,
    watcher_env,
)
from tools.soak_watch import Soak

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def launch(server, tmp_path):
    """Start watchers against `server`; every one still running is killed at the end."""
    started: list[WatcherProcess] = []

    def start(*args, name="watcher", **env):
        kubeconfig = write_kubeconfig(tmp_path, server.url)
        environment = watcher_env(database_env(), kubeconfig, tmp_path / name, **env)
        (tmp_path / name).mkdir(exist_ok=True)
        process = WatcherProcess(
            environment, ["--no-nodes", *args], tmp_path / f"{name}.log"
        )
        started.append(process.start())
        return process

    yield start
    for process in started:
        if process.process.poll() is None:
            process.kill()


class Cluster:
    """Pipeline pods on the fake server, remembering what must be counted."""

    def __init__(self, server):
        self.server = server
        self.placed = {}
        self.serial = 0

    def bind_new(self, node, label="pipe-a"):
        self.serial += 1
        name = f"p{self.serial}"
        self.server.add_pod(make_pod(name, label=label))
        pod = self.server.bind_pod(name, node)
        self.placed[pod["metadata"]["uid"]] = (label, node)
        return name

    def counted(self):
        return set(self.placed) <= set(
            Placement.objects.values_list("pod_uid", flat=True)
        )

    def assert_exact(self):
        assert wait_until(self.counted, timeout=15)
        assert stored_counts() == expected_counts(self.placed)
        assert Placement.objects.count() == len(self.placed)
        assert audit.audit_counts()[1] == []


def health(tmp_path, name, *args):
    env = {
        **database_env(),
        "KSSCHED_HEARTBEAT_PATH": str(tmp_path / name / "heartbeat"),
    }
    return subprocess.run(
        [sys.executable, "manage.py", "watcher_health", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )


def test_sigterm_exits_zero_within_seconds_and_serves_metrics(server, launch, tmp_path):
    cluster = Cluster(server)
    cluster.bind_new("n1")
    port = free_port()
    watcher = launch(KSSCHED_WATCHER_METRICS_BIND=f"127.0.0.1:{port}")
    cluster.bind_new("n2")
    cluster.assert_exact()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    text = body.read().decode()
    assert "placements_recorded_total 2.0" in text
    assert 'watch_events_total{type="LISTED"}' in text
    assert "last_event_age_seconds" in text
    assert health(tmp_path, "watcher").returncode == 0
    # While a watch is open and idle:
    time.sleep(0.3)
    code, seconds = watcher.stop()
    assert code == 0, watcher.log
    assert seconds < 5
    assert "Stopped" in watcher.log
    time.sleep(0.2)
    stale = health(tmp_path, "watcher", "--max-age", "0.1")
    assert stale.returncode == 1 and "unhealthy" in stale.stderr
    assert health(tmp_path, "nowhere").returncode == 1


def test_the_metrics_listen_only_on_the_configured_address(server, launch):
    """KSSCHED_WATCHER_METRICS_BIND=127.0.0.2:PORT: served there, and not on the
    other addresses of the machine (127.0.0.1 stands for them)."""
    port = free_port()
    watcher = launch(KSSCHED_WATCHER_METRICS_BIND=f"127.0.0.2:{port}")
    assert wait_until(lambda: "Serving watcher metrics" in watcher.log, timeout=15)
    url = f"http://127.0.0.2:{port}/metrics"
    assert (
        "placements_recorded_total"
        in urllib.request.urlopen(url, timeout=5).read().decode()
    )
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert f"Serving watcher metrics on 127.0.0.2:{port}" in watcher.log
    assert watcher.stop()[0] == 0


def test_sigkill_mid_stream_then_restart_resumes_from_the_checkpoint(server, launch):
    """Pods bound, and bound and deleted, while the watcher is down are all counted."""
    cluster = Cluster(server)
    watcher = launch()
    cluster.bind_new("n0")
    cluster.assert_exact()
    for i in range(5):
        cluster.bind_new(f"n{i % 2}")
    time.sleep(0.02)
    watcher.kill()  # mid-stream, maybe mid-transaction
    assert audit.audit_counts()[1] == []
    down_since = time.monotonic()
    cluster.bind_new("n1")
    gone = cluster.bind_new("n2", label="short-lived")
    server.modify_pod(gone, {"status": {"phase": "Succeeded"}})
    server.delete_pod(gone)
    restarted = launch(name="again")
    cluster.assert_exact()
    lists_after = [r for r in server.requests if r.verb == "list" and r.at > down_since]
    assert lists_after == []  # resumed from the saved resourceVersion
    uid = next(u for u, (label, _) in cluster.placed.items() if label == "short-lived")
    # The binding is written at once; the end behind it may wait for the events
    # that follow it (arrivals.LINGER_SECONDS).
    assert wait_until(
        lambda: Placement.objects.get(pod_uid=uid).finished_at is not None, timeout=15
    )
    assert restarted.stop()[0] == 0


def test_two_watchers_on_one_database_count_once(server, launch):
    """Two active replicas on one database; the ledger drops every duplicate."""
    cluster = Cluster(server)
    for i in range(5):
        cluster.bind_new(f"n{i % 3}", label="two-w")
    first = launch(name="first")
    second = launch(name="second")
    for i in range(25):
        cluster.bind_new(f"n{i % 3}", label="two-w")
    cluster.assert_exact()
    time.sleep(0.5)
    assert first.stop()[0] == 0
    assert second.stop()[0] == 0
    cluster.assert_exact()


def test_leader_election_one_active_and_failover(server, launch):
    """With leader election one replica counts; after its death the standby does."""
    cluster = Cluster(server)
    env = {"POD_NAMESPACE": "ks-pipelines"}
    first = launch("--leader-elect", name="a", POD_NAME="a", **env)
    assert wait_until(
        lambda: (
            (server.get("leases", "ks-scheduler-watcher") or {})
            .get("spec", {})
            .get("holderIdentity")
            == "a"
        ),
        timeout=10,
    )
    second = launch("--leader-elect", name="b", POD_NAME="b", **env)
    cluster.bind_new("n1")
    cluster.assert_exact()
    assert wait_until(lambda: "Standing by" in second.log, timeout=10)
    first.kill()
    cluster.bind_new("n2")
    cluster.assert_exact()  # within lease duration (2 s) + retry
    lease = server.get("leases", "ks-scheduler-watcher")
    assert lease["spec"]["holderIdentity"] == "b"
    assert WatchState.objects.get(name="pods").holder == "b"
    assert second.stop()[0] == 0
    released = server.get("leases", "ks-scheduler-watcher")
    assert not released["spec"].get("holderIdentity")


def test_a_held_write_lock_delays_but_loses_nothing(server, launch):
    """Another connection holds the write lock; events are retried, none lost."""
    cluster = Cluster(server)
    watcher = launch()
    cluster.bind_new("n1")
    cluster.assert_exact()
    with hold_write_lock(2.5):
        for i in range(5):
            cluster.bind_new(f"n{i % 2}", label="locked-out")
        time.sleep(1.5)
    cluster.assert_exact()
    assert watcher.stop()[0] == 0
    from django.db import connection

    if connection.vendor == "sqlite":
        assert "Database error on pods" in watcher.log


def test_scripted_run_with_faults_ends_with_exact_counts(tmp_path):
    """A small version of `make soak`: drops, 410, silence, replays, SIGKILL, lock."""
    soak = Soak(pods=150, base_env=database_env(), workdir=tmp_path, seed=3)
    try:
        figures = soak.run()
    finally:
        soak.close()
    assert figures["counts_exact"], figures
    assert figures["placements_found"] == figures["placements_expected"] == 200
    assert figures["pipeline_pods"] == 200  # 150 with faults, then a burst of 50
    assert figures["audit_drift"] == 0
    assert figures["exit_status"] == 0
    assert figures["faults"]["sigkill_restart"] == 1
    assert figures["faults"]["db_lock"] == 1
    assert figures["faults_total"] >= 4


def test_sigint_is_handled_like_sigterm(server, launch):
    watcher = launch()
    assert wait_until(lambda: server.watch_requests("pods"), timeout=10)
    watcher.signal(signal.SIGINT)
    assert watcher.process.wait(timeout=5) == 0


def test_repeated_sigkill_at_random_moments_keeps_the_database_consistent(
    server, launch
):
    """After every kill the audit balances; the last watcher makes it exact."""
    import random

    rng = random.Random(11)
    cluster = Cluster(server)
    for round_ in range(4):
        watcher = launch(name=f"round{round_}")
        before = Placement.objects.count()
        for i in range(15):
            cluster.bind_new(f"n{i % 3}", label=f"kill-r{round_}")
        assert wait_until(lambda b=before: Placement.objects.count() > b, timeout=10)
        time.sleep(rng.uniform(0, 0.05))
        watcher.kill()
        assert audit.audit_counts()[1] == []
    final = launch(name="final")
    cluster.assert_exact()
    assert wait_until(lambda: "Resuming the pod watch" in final.log, timeout=10)
    assert final.stop()[0] == 0
