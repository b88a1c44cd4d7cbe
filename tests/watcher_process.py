"""`manage.py watch_pods` as a subprocess, and what tests check it against.

Shared by the watcher tests (tests/test_watch_process.py, tests/test_concurrency.py)
and the scripts in tools/ (soak, outcomes demo): the watcher subprocess with small
timeouts, a database write lock held from another connection, and the KeyNode counts
expected from the placements.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import REPO

# Small timeouts so faults heal in about a second.
FAST_ENV = {
    "KSSCHED_WATCH_READ_TIMEOUT": "1.5",
    "KSSCHED_WATCH_CONNECT_TIMEOUT": "1",
    "KSSCHED_WATCH_TIMEOUT_MIN": "3",
    "KSSCHED_WATCH_TIMEOUT_MAX": "6",
    "KSSCHED_WATCH_BACKOFF_BASE": "0.1",
    "KSSCHED_WATCH_BACKOFF_CAP": "1",
    "KSSCHED_WATCH_BACKOFF_RESET": "5",
    "KSSCHED_WATCHER_METRICS_BIND": "",
    "KSSCHED_SQLITE_TIMEOUT": "0.5",
    "KSSCHED_LEASE_DURATION": "2",
    "KSSCHED_LEASE_RENEW_DEADLINE": "1.5",
    "KSSCHED_LEASE_RETRY_PERIOD": "0.3",
}


class WatcherProcess:
    """`manage.py watch_pods` as a subprocess, logging to a file."""

    def __init__(self, env: dict[str, str], args: list[str], log: Path) -> None:
        self.env = env
        self.args = args
        self.log_path = log
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> WatcherProcess:
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "watch_pods", *self.args],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return self

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    READY = "Watching all pods"

    def wait_ready(self, timeout: float = 20.0) -> bool:
        """Wait until this run has installed its signal handlers (logged READY)."""
        return wait_until(
            lambda: (
                self.log.count(self.READY) >= self.starts
                or self.process.poll() is not None
            ),
            timeout,
        )

    def stop(self, timeout: float = 10.0) -> tuple[int, float]:
        """SIGTERM (once it is ready) and wait; returns (exit status, seconds)."""
        self.wait_ready()
        started = time.monotonic()
        self.signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        return code, time.monotonic() - started

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.process.wait()

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def watcher_env(
    base: dict[str, str], kubeconfig: Path, workdir: Path, **extra: str
) -> dict[str, str]:
    env = {**base, **FAST_ENV}
    env["KUBECONFIG"] = str(kubeconfig)
    env["KSSCHED_HEARTBEAT_PATH"] = str(Path(workdir) / "heartbeat")
    env.update(extra)
    return env


@contextmanager
def hold_write_lock(seconds: float):
    """Hold the database write lock from another connection for `seconds`.

    SQLite: BEGIN IMMEDIATE on the same file. PostgreSQL: a row lock on the
    watcher's checkpoint row (its next commit waits). Runs in a thread; the block
    yields once the lock is held.
    """
    from django.db import connection

    held = threading.Event()
    done = threading.Event()

    def sqlite_holder() -> None:
        db = sqlite3.connect(connection.settings_dict["NAME"], timeout=30)
        try:
            db.execute("BEGIN IMMEDIATE")
            held.set()
            time.sleep(seconds)
            db.rollback()
        finally:
            db.close()
            done.set()

    def postgres_holder() -> None:
        from django.db import connections

        conn = connections.create_connection("default")
        try:
            with conn.cursor() as cursor:
                conn.set_autocommit(False)
                cursor.execute(
                    "INSERT INTO history_watchstate (name, resource_version, "
                    "relists, events, holder, skipped_events, last_skipped, updated) "
                    "VALUES ('pods', '', 0, 0, '', 0, '', now()) "
                    "ON CONFLICT (name) DO NOTHING"
                )
                conn.commit()
                cursor.execute(
                    "SELECT name FROM history_watchstate WHERE name = 'pods' FOR UPDATE"
                )
                held.set()
                time.sleep(seconds)
                conn.rollback()
        finally:
            conn.close()
            done.set()

    target = sqlite_holder if connection.vendor == "sqlite" else postgres_holder
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    held.wait(10)
    try:
        yield
    finally:
        done.wait(seconds + 10)


def expected_counts(placed: dict[str, tuple[str, str]]) -> Counter:
    """KeyNode counts for {uid: (label at binding, node)}."""
    from history.labels import placement_keys

    counts: Counter = Counter()
    for label, node in placed.values():
        for key in placement_keys(label):
            counts[key, node] += 1
    return counts


def stored_counts() -> Counter:
    from history.models import KeyNode

    return Counter(
        {
            (key, node): count
            for key, node, count in KeyNode.objects.values_list("key", "node", "count")
            if count
        }
    )


def ledger_uids() -> set[str]:
    from history.models import Placement

    return set(Placement.objects.values_list("pod_uid", flat=True))


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
