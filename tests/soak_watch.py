"""A scripted watcher run: many pods through the fake API server, faults on the way.

`python -m tests.soak_watch --pods 1000` (or `make soak`) migrates a fresh SQLite
file (or uses DATABASE_URL), runs `manage.py watch_pods` as a subprocess against
tests/fakeapi/ in cluster mode, and drives pods through it: created, bound,
finished, relabelled and deleted, while injecting dropped and truncated streams,
410 Gone, silent streams, duplicate replays, 500s, a SIGKILL restart (with pods bound
and deleted while it is down) and a held database write lock. It ends with exact
expected counts or exits 1, prints the figures and writes them as JSON.

The helpers here (kubeconfig, watcher subprocess, database lock holder, expected
counts) are shared with tests/test_watch*.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from tests.fakeapi import (
    ClusterWatch,
    FakeApiServer,
    StatusAction,
    WatchAction,
    expired,
    make_node,
    make_pod,
)

REPO = Path(__file__).resolve().parent.parent

# Small timeouts so faults heal in about a second.
FAST_ENV = {
    "KSSCHED_WATCH_READ_TIMEOUT": "1.5",
    "KSSCHED_WATCH_CONNECT_TIMEOUT": "1",
    "KSSCHED_WATCH_TIMEOUT_MIN": "3",
    "KSSCHED_WATCH_TIMEOUT_MAX": "6",
    "KSSCHED_WATCH_BACKOFF_BASE": "0.1",
    "KSSCHED_WATCH_BACKOFF_CAP": "1",
    "KSSCHED_WATCH_BACKOFF_RESET": "5",
    "KSSCHED_WATCHER_METRICS_PORT": "0",
    "KSSCHED_SQLITE_TIMEOUT": "0.5",
    "KSSCHED_LEASE_DURATION": "2",
    "KSSCHED_LEASE_RENEW_DEADLINE": "1.5",
    "KSSCHED_LEASE_RETRY_PERIOD": "0.3",
}

LABELS = [
    "jenkins-java-maven-1",
    "jenkins-java-gradle",
    "jenkins-go",
    "gitlab-node-14",
    "gitlab-node-16-a",
    "gitlab--python-3",
    "batch-etl",
]


def write_kubeconfig(directory: Path, url: str) -> Path:
    """A kubeconfig whose only context points at `url` (the fake API server)."""
    path = Path(directory) / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: fake, cluster: {{server: "{url}"}}}}]\n'
        "users: [{name: watcher, user: {token: not-a-secret}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: watcher}}]\n"
        "current-context: fake\n"
    )
    return path


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
    from history.labels import distinct_keys, split_pipeline_label

    counts: Counter = Counter()
    for label, node in placed.values():
        for key in distinct_keys(split_pipeline_label(label)):
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


# --------------------------------------------------------------------------- the run


class Soak:
    """Drive `pods` pipeline pods through one watcher with faults; see run()."""

    def __init__(self, *, pods: int, base_env: dict[str, str], workdir: Path, seed=7):
        self.pods = pods
        self.workdir = Path(workdir)
        self.rng = random.Random(seed)
        self.server = FakeApiServer(bookmark_interval=0.5)
        self.kubeconfig = write_kubeconfig(self.workdir, self.server.url)
        self.env = watcher_env(base_env, self.kubeconfig, self.workdir)
        self.nodes = [f"node-{i}" for i in range(8)]
        for node in self.nodes:
            self.server.add_node(make_node(node))
        self.placed: dict[str, tuple[str, str]] = {}  # uid -> (label, node)
        self.uids: dict[str, str] = {}  # name -> uid
        self.bound: list[str] = []
        self.faults: Counter = Counter()
        self.watcher = WatcherProcess(
            self.env, ["--count-when", "bound"], self.workdir / "watcher.log"
        )
        self._serial = 0
        self.other_pods = 0

    # ---- pod life

    def create(self) -> str:
        self._serial += 1
        name = f"pipe-{self._serial:05d}"
        pod = self.server.add_pod(make_pod(name, label=self.rng.choice(LABELS)))
        self.uids[name] = pod["metadata"]["uid"]
        return name

    def bind(self, name: str) -> None:
        node = self.rng.choice(self.nodes)
        pod = self.server.bind_pod(name, node)
        label = pod["metadata"]["labels"]["ks-pipeline"]
        self.placed[pod["metadata"]["uid"]] = (label, node)
        self.bound.append(name)

    def noise(self) -> None:
        """Pods the watcher must never count: other scheduler, no label."""
        self._serial += 1
        other = make_pod(f"other-{self._serial}", scheduler="default-scheduler")
        self.server.add_pod(other)
        self.server.bind_pod(other["metadata"]["name"], self.rng.choice(self.nodes))
        plain = make_pod(f"plain-{self._serial}", label=None)
        self.server.add_pod(plain)
        self.server.bind_pod(plain["metadata"]["name"], self.rng.choice(self.nodes))
        self.other_pods += 2

    def after_binding(self, recorded: set[str]) -> None:
        """Finish, relabel or delete some bound pods the ledger already holds."""
        for name in list(self.bound):
            if self.uids[name] not in recorded:
                continue
            roll = self.rng.random()
            if roll < 0.3:
                self.server.modify_pod(name, {"status": {"phase": "Succeeded"}})
            elif roll < 0.4:
                self.server.modify_pod(
                    name, {"metadata": {"labels": {"ks-pipeline": "relabelled-x"}}}
                )
            elif roll < 0.7:
                self.server.delete_pod(name)
                self.bound.remove(name)

    # ---- faults

    def inject(self, kind: str) -> None:
        self.faults[kind] += 1
        server = self.server
        if kind == "drop":
            server.inject(ClusterWatch(max_events=self.rng.randint(1, 20), end="abort"))
        elif kind == "truncate":
            server.inject(
                ClusterWatch(max_events=self.rng.randint(1, 20), end="truncate")
            )
        elif kind == "gone_410":
            server.inject(WatchAction([expired(1, server.resource_version)]))
        elif kind == "silent":
            server.inject(WatchAction([], end="silent"))
        elif kind == "duplicate_replay":
            history = server.events("pods")
            server.inject(WatchAction(history[-self.rng.randint(20, 80) :]))
        elif kind == "http_500":
            server.inject(StatusAction(500), times=3)
        else:
            raise ValueError(kind)

    # ---- the run

    def caught_up(self) -> bool:
        return set(self.placed) <= ledger_uids()

    def run(self) -> dict:
        started = time.monotonic()
        self.watcher.start()
        kinds = [
            "drop",
            "truncate",
            "gone_410",
            "silent",
            "duplicate_replay",
            "http_500",
        ]
        waves = max(4, self.pods // 50)
        per_wave = -(-self.pods // waves)
        kill_wave = waves // 2
        lock_wave = waves // 3
        created = 0
        for wave in range(waves):
            count = min(per_wave, self.pods - created)
            if count <= 0:
                break
            if wave == kill_wave:
                self._kill_and_restart(count)
                created += count
                continue
            self.inject(kinds[wave % len(kinds)])
            names = [self.create() for _ in range(count)]
            created += count
            self.noise()
            if wave == lock_wave:
                self.faults["db_lock"] += 1
                with hold_write_lock(2.0):
                    for name in names:
                        self.bind(name)
            else:
                for name in names:
                    self.bind(name)
            # Pace the waves by the watcher, so each fault meets a live stream.
            wait_until(self.caught_up, timeout=30)
            self.after_binding(ledger_uids())
        caught_up = wait_until(self.caught_up, timeout=60)
        burst = self._burst(max(50, self.pods // 4))
        caught_up = caught_up and burst["caught_up"]
        time.sleep(1.0)  # let late duplicates and finishes land
        code, stop_seconds = self.watcher.stop()
        wall = time.monotonic() - started
        figures = self.figures(caught_up, code, stop_seconds, wall)
        figures.update(burst)
        return figures

    def _burst(self, count: int) -> dict:
        """Fault-free: bind `count` more pods at once; time until all are recorded."""
        from history.models import WatchState

        def events() -> int:
            state = WatchState.objects.filter(name="pods").first()
            return state.events if state else 0

        def checkpoint() -> str:
            state = WatchState.objects.filter(name="pods").first()
            return state.resource_version if state else ""

        # Every injected fault consumed, and replays done: the watcher is current.
        wait_until(lambda: not self.server._injections, timeout=30)
        wait_until(lambda: checkpoint() == self.server.resource_version, timeout=30)
        before = events()
        names = [self.create() for _ in range(count)]
        started = time.monotonic()
        for name in names:
            self.bind(name)
        caught_up = wait_until(self.caught_up, timeout=60, interval=0.02)
        seconds = time.monotonic() - started
        recorded = events() - before
        return {
            "burst_pods": count,
            "burst_events_recorded": recorded,
            "burst_seconds": round(seconds, 2),
            "burst_events_per_second": round(recorded / seconds, 1),
            "caught_up": caught_up,
        }

    def _kill_and_restart(self, count: int) -> None:
        """SIGKILL mid-stream; bind, finish and delete pods while it is down."""
        # A pending 410 would turn the restart into a relist, which by design cannot
        # see pods bound and deleted while the watcher was down.
        wait_until(lambda: not self.server._injections, timeout=15)
        names = [self.create() for _ in range(count)]
        half = len(names) // 2
        for name in names[:half]:
            self.bind(name)
        time.sleep(0.2)
        self.watcher.kill()
        self.faults["sigkill_restart"] += 1
        for name in names[half:]:
            self.bind(name)
        for name in names[half : half + max(1, half // 3)]:
            self.server.modify_pod(name, {"status": {"phase": "Succeeded"}})
            self.server.delete_pod(name)
            self.bound.remove(name)
        self.watcher.start()
        # A 410 before the replay has passed the deletions would turn this restart
        # into a relist (the documented loss bound); let the replay finish first.
        wait_until(self.caught_up, timeout=30)

    def figures(self, caught_up: bool, code: int, stop_seconds: float, wall: float):
        from history.audit import audit_counts
        from history.models import Placement, WatchState

        expected = expected_counts(self.placed)
        found = stored_counts()
        checked, drifts = audit_counts()
        state = WatchState.objects.filter(name="pods").first()
        requests = self.server.requests
        figures = {
            "pipeline_pods": len(self.uids),
            "other_pods": self.other_pods,
            "placements_expected": len(self.placed),
            "placements_found": Placement.objects.count(),
            "api_object_changes": int(self.server.resource_version) - 1,
            "watch_requests": sum(1 for r in requests if r.is_watch),
            "list_requests": sum(1 for r in requests if r.verb == "list"),
            "events_recorded": state.events if state else 0,
            "relists": state.relists if state else 0,
            "faults": dict(sorted(self.faults.items())),
            "faults_total": sum(self.faults.values()),
            "counts_expected": sum(expected.values()),
            "counts_found": sum(found.values()),
            "key_node_pairs_expected": len(expected),
            "key_node_pairs_found": len(found),
            "counts_exact": expected == found,
            "audit_pairs_checked": checked,
            "audit_drift": len(drifts),
            "caught_up": caught_up,
            "exit_status": code,
            "stop_seconds": round(stop_seconds, 2),
            "wall_seconds": round(wall, 2),
        }
        figures["events_per_second"] = round(figures["events_recorded"] / wall, 1)
        figures["ok"] = (
            figures["counts_exact"]
            and figures["placements_found"] == figures["placements_expected"]
            and not drifts
            and code == 0
        )
        return figures

    def close(self) -> None:
        if self.watcher.process is not None and self.watcher.process.poll() is None:
            self.watcher.kill()
        self.server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--json", default=str(REPO / "var" / "soak-watch.json"), help="Output file."
    )
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="ks-soak-"))
    base_env = {
        "SECRET_KEY": "soak-not-a-secret-0123456789abcdefghijklmnopqrstuvwxyz",
        "DEBUG": "0",
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "KSSCHED_READ_DOT_ENV": "0",
        "LOG_LEVEL": "INFO",
    }
    if os.environ.get("DATABASE_URL"):
        base_env["DATABASE_URL"] = os.environ["DATABASE_URL"]
    else:
        base_env["DATA_PATH"] = str(workdir / "scheduler.db")
    os.environ.update(base_env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kssched.settings")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=REPO,
        env=base_env,
        check=True,
    )
    import django

    django.setup()
    soak = Soak(pods=args.pods, base_env=base_env, workdir=workdir, seed=args.seed)
    try:
        figures = soak.run()
    finally:
        soak.close()
    figures["command"] = "python -m tests.soak_watch " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    figures["database"] = "postgresql" if "DATABASE_URL" in base_env else "sqlite"
    figures["watcher_log"] = str(soak.watcher.log_path)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    print(f"figures written to {args.json}")
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
