"""`make demo`: ks-scheduler on a simulated cluster, no Kubernetes needed.

Runs the real parts against the test API server (tests/fakeapi/):

- the extender and admin under gunicorn, on 127.0.0.1 only;
- `manage.py watch_pods`, which lists and watches the simulated pods and records
  each placement, exactly as in a cluster;
- a driver in this process that plays kube-scheduler and the kubelets: pipeline pods
  arrive (with fan-out bursts), each is scored by calling the real prioritize endpoint
  and bound to the best node (extender score × weight × 10 plus a least-allocated
  score, as kube-scheduler adds them); its container starts after a startup that is
  short where this pipeline ran before, longer where only a pipeline sharing a
  label prefix did and longest on a cold node, runs for a while and finishes, and
  the pod's status says so (PodScheduled, startedAt, finishedAt) as a kubelet's does.

The pipelines are those of an organisation: several CI systems and teams, each with
its services, some service names (`api`, `worker`, `docs`) used by more than one
team. The progress line reports the ledger's own warmth (`history_placement.warmth`,
what the watcher recorded), the same exact, partial and cold as the admin's.

Its database lives in var/demo/ and starts empty on every run; `make run`'s history is
left alone. A second demo on the same directory (a lock on var/demo/demo.lock) or on a
port in use stops with one line before it touches anything. It stops after --minutes
or on Ctrl-C (SIGINT/SIGTERM), stopping its children. Standard library only in this
process: Django runs in the children.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from history.labels import path_keys, placement_keys
from tests.fakeapi import (
    FakeApiServer,
    make_node,
    make_pod,
    pod_status,
    write_kubeconfig,
)
from tests.servers import wait_for_port
from tools import port_check

REPO = Path(__file__).resolve().parent.parent
USERNAME = "demo"
# Held by the running demo: a second one on the same directory stops before wiping it.
LOCK_FILE = "demo.lock"
# kube-scheduler adds score × weight × 10; deploy/ ships weight 5.
EXTENDER_WEIGHT = 5
# An organisation's pipelines, `<ci-system>-<team>-<language>-<service>`: several CI
# systems and teams, and service names more than one team uses (api, worker, docs).
# Each label gets its popularity by Zipf.
TEAMS = [
    ("jenkins", "payments", "java", ["api", "ledger", "worker"]),
    ("jenkins", "identity", "java", ["api", "auth"]),
    ("gitlab", "search", "go", ["api", "indexer", "worker"]),
    ("gitlab", "data", "python", ["etl", "worker", "docs"]),
    ("github", "web", "node", ["frontend", "admin", "docs"]),
    ("github", "mobile", "kotlin", ["api", "app"]),
    ("tekton", "platform", "go", ["gateway", "operator"]),
]
# Seconds from binding to the container's start, by how warm the node is for the
# pipeline (the ledger's definition), and the run itself. Short enough that the
# outcomes and the time saved fill in the first minutes.
STARTUP = {"exact": (2, 6), "partial": (10, 18), "cold": (25, 45)}
RUN = (20, 90)
# Seconds the emulated kube-scheduler waits for an answer.
CALL_TIMEOUT = 30
# Said wherever the demo shows times (here, and in the admin: tools/demo_settings.py).
MADE_UP = (
    "Made-up times: startup and run times are drawn by warmth class (STARTUP, RUN in "
    "tools/demo.py),\nso the time saved the demo shows is made up, not measured."
)


def pipeline_labels() -> list[str]:
    return [
        f"{system}-{team}-{language}-{service}"
        for system, team, language, services in TEAMS
        for service in services
    ]


def ledger_warmth(database: Path) -> dict[str, int]:
    """Placements per warmth as the watcher recorded them in the ledger."""
    if not database.exists():
        return {}
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as db:
        rows = db.execute(
            "SELECT warmth, COUNT(*) FROM history_placement GROUP BY warmth"
        ).fetchall()
    return {warmth: count for warmth, count in rows}


def warmth_line(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    if not total:
        return "ledger: no placements yet"
    shares = ", ".join(
        f"{counts.get(level, 0) / total:.0%} {level}"
        for level in ("exact", "partial", "cold")
    )
    return f"ledger: {total} placements, {shares}"


@dataclass
class RunningPod:
    name: str
    node: str
    scheduled: datetime
    starts_at: float
    ends_at: float
    started: datetime | None = None


@dataclass
class Simulation:
    """The emulated kube-scheduler and kubelets, driving the test API server."""

    server: FakeApiServer
    extender_url: str
    nodes: list[str]
    capacity: int
    rng: random.Random
    labels: list[str] = field(default_factory=pipeline_labels)
    running: list[RunningPod] = field(default_factory=list)
    placed: int = 0
    number: int = 0
    # What ran on each node: every key a placement counts under (labels.placement_keys).
    ran: dict[str, set[str]] = field(default_factory=dict)

    def warmth(self, label: str, node: str) -> str:
        """The ledger's warmth: exact when this pipeline ran on `node`, partial when
        a pipeline sharing a leading run of its segments did, else cold."""
        keys, ran = path_keys(label), self.ran.get(node, set())
        if keys[-1] in ran:
            return "exact"
        return "partial" if any(key in ran for key in keys[:-1]) else "cold"

    def popular_label(self) -> str:
        # Zipf-like: the first labels of a shuffled list are the hot pipelines.
        weights = [1 / (rank + 1) for rank in range(len(self.labels))]
        return self.rng.choices(self.labels, weights=weights)[0]

    def prioritize(self, label: str, nodes: list[str]) -> dict[str, int]:
        body = {
            "Pod": {"metadata": {"labels": {"ks-pipeline": label}}},
            "Nodes": None,
            "NodeNames": nodes,
        }
        request = urllib.request.Request(
            f"{self.extender_url}/scheduler/priorities/pipeline",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        # Generous: a worker's first call loads Django, seconds on a busy machine.
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as answer:
            return {row["Host"]: row["Score"] for row in json.load(answer)}

    def schedule(self, label: str) -> None:
        """Create one pipeline pod, score the nodes with room, bind it to the best."""
        self.number += 1
        name = f"{label}-{self.number}"
        self.server.add_pod(make_pod(name, label=label))
        load = {node: 0 for node in self.nodes}
        for pod in self.running:
            load[pod.node] += 1
        feasible = [node for node in self.nodes if load[node] < self.capacity]
        if not feasible:
            return
        scores = self.prioritize(label, feasible)

        def total(node: str) -> float:
            least_allocated = 100 * (1 - load[node] / self.capacity)
            return scores.get(node, 0) * EXTENDER_WEIGHT * 10 + least_allocated

        best = max(total(node) for node in feasible)
        node = self.rng.choice([n for n in feasible if total(n) == best])
        startup = self.rng.uniform(*STARTUP[self.warmth(label, node)])
        self.ran.setdefault(node, set()).update(placement_keys(label))
        scheduled = datetime.now(UTC)
        self.report(name, node, scheduled=scheduled)
        self.placed += 1
        starts_at = time.monotonic() + startup
        ends_at = starts_at + self.rng.uniform(*RUN)
        self.running.append(RunningPod(name, node, scheduled, starts_at, ends_at))

    def report(self, name: str, node: str, **status) -> None:
        """Write the pod's status as its kubelet would (`pod_status`)."""

        def change(pod):
            pod["spec"]["nodeName"] = node
            pod["status"] = pod_status(**status)

        self.server.modify_pod(name, change)

    def start_and_finish_due(self) -> None:
        """Containers whose startup is over start; pods whose run is over succeed
        (or fail, now and then) and are deleted."""
        now = time.monotonic()
        for pod in self.running:
            if pod.started is None and pod.starts_at <= now:
                pod.started = datetime.now(UTC)
                self.report(
                    pod.name, pod.node, scheduled=pod.scheduled, started=pod.started
                )
        due = [pod for pod in self.running if pod.ends_at <= now]
        self.running = [pod for pod in self.running if pod.ends_at > now]
        for pod in due:
            exit_code = 1 if self.rng.random() < 0.05 else 0
            self.report(
                pod.name,
                pod.node,
                scheduled=pod.scheduled,
                started=pod.started or datetime.now(UTC),
                finished=datetime.now(UTC),
                exit_code=exit_code,
            )
            self.server.delete_pod(pod.name)

    def tick(self, rate: float) -> None:
        """One second of the cluster: arrivals (sometimes a fan-out), container
        starts and endings."""
        self.start_and_finish_due()
        arrivals = self.poisson(rate)
        for _ in range(arrivals):
            label = self.popular_label()
            fan_out = self.rng.randint(3, 6) if self.rng.random() < 0.08 else 1
            for _ in range(fan_out):
                self.schedule(label)

    def poisson(self, rate: float) -> int:
        count, threshold, product = 0, pow(2.718281828459045, -rate), 1.0
        while True:
            product *= self.rng.random()
            if product <= threshold:
                return count
            count += 1


def child_env(
    args: argparse.Namespace, secret_key: str, demo_dir: Path
) -> dict[str, str]:
    """The settings every child gets: the demo's own database, loopback, no .env."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "HOME": os.environ.get("HOME", str(demo_dir)),
        "KSSCHED_READ_DOT_ENV": "0",
        # The checkout's settings plus the label on the demo's made-up times.
        "DJANGO_SETTINGS_MODULE": "tools.demo_settings",
        "SECRET_KEY": secret_key,
        "DATA_PATH": str(demo_dir / "demo.db"),
        "KSSCHED_HEARTBEAT_PATH": str(demo_dir / "watcher" / "heartbeat"),
        "KSSCHED_WATCHER_METRICS_BIND": "",
        "KSSCHED_BIND": f"127.0.0.1:{args.port}",
        "WEB_CONCURRENCY": "2",
        "KSSCHED_SCORING": "warm",
        # Shorter watches than in a cluster, so the demo shows re-watches too.
        "KSSCHED_WATCH_TIMEOUT_MIN": "30",
        "KSSCHED_WATCH_TIMEOUT_MAX": "60",
        "KSSCHED_WATCH_READ_TIMEOUT": "20",
        "LOG_LEVEL": "INFO",
    }


def manage(env: dict[str, str], *args: str, **extra: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env={**env, **extra},
        check=True,
        stdout=subprocess.DEVNULL,
    )


def stop(process: subprocess.Popen, timeout: float = 20) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def claim(demo_dir: Path, port: int) -> IO[str] | str:
    """An exclusive lock on `demo_dir`, held while this process lives (the open file),
    or the line that says which demo holds it and how to run a second one."""
    lock = open(demo_dir / LOCK_FILE, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        free = port_check.free_port_after("127.0.0.1", port) or "PORT"
        return (
            f"make demo: a demo is running on {demo_dir} ({holder}): stop it first, "
            f"or run a second one on a free DEMO_PORT and its own directory, e.g. "
            f"make demo DEMO_PORT={free} DEMO_ARGS='--dir var/demo-{free}'"
        )
    lock.truncate(0)
    lock.write(f"pid {os.getpid()}, http://127.0.0.1:{port}/admin/\n")
    lock.flush()
    return lock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8090, help="Admin port (8090).")
    parser.add_argument("--minutes", type=float, default=30, help="Run time (30).")
    parser.add_argument("--nodes", type=int, default=36, help="Simulated nodes.")
    parser.add_argument(
        "--rate", type=float, default=1.5, help="Pipelines arriving per second (1.5)."
    )
    parser.add_argument("--seed", type=int, default=None, help="Random seed.")
    parser.add_argument(
        "--dir", type=Path, default=REPO / "var" / "demo", help="Data (var/demo)."
    )
    args = parser.parse_args(argv)
    demo_dir = args.dir.resolve()

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    # Nothing is wiped while another demo uses this directory or the port is taken.
    demo_dir.mkdir(parents=True, exist_ok=True)
    lock = claim(demo_dir, args.port)
    if isinstance(lock, str):
        print(lock, file=sys.stderr, flush=True)
        return 1
    taken = port_check.problem(
        "demo", "DEMO_PORT", f"127.0.0.1:{args.port}", port_only=True
    )
    if taken:
        print(taken, file=sys.stderr, flush=True)
        return 1

    # A fresh start: the previous run's database, logs and heartbeat go.
    shutil.rmtree(demo_dir / "watcher", ignore_errors=True)
    for old in demo_dir.glob("demo.db*"):
        old.unlink()
    (demo_dir / "watcher").mkdir(parents=True)
    env = child_env(args, secrets.token_urlsafe(50), demo_dir)
    password = secrets.token_urlsafe(12)
    print(f"Preparing the demo database in {demo_dir} ...", flush=True)
    manage(env, "migrate", "--noinput")
    manage(
        env,
        "createsuperuser",
        "--noinput",
        DJANGO_SUPERUSER_USERNAME=USERNAME,
        DJANGO_SUPERUSER_EMAIL="demo@example.com",
        DJANGO_SUPERUSER_PASSWORD=password,
    )

    rng = random.Random(args.seed)
    nodes = [f"worker-{zone}{n}" for zone in "abc" for n in range(1, 13)]
    nodes = (nodes * (args.nodes // len(nodes) + 1))[: args.nodes]
    if len(set(nodes)) < len(nodes):
        nodes = [f"worker-{n:03d}" for n in range(1, args.nodes + 1)]
    server = FakeApiServer(bookmark_interval=10.0, default_watch_timeout=60.0)
    for node in nodes:
        server.add_node(make_node(node))
    kubeconfig = write_kubeconfig(demo_dir, server.url)

    logs = {name: open(demo_dir / f"{name}.log", "wb") for name in ("web", "watcher")}
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "kssched/gunicorn_conf.py"]
        + ["--bind", f"127.0.0.1:{args.port}", "kssched.wsgi"],
        cwd=REPO,
        env=env,
        stdout=logs["web"],
        stderr=subprocess.STDOUT,
    )
    watcher = subprocess.Popen(
        [sys.executable, "manage.py", "watch_pods"],
        cwd=REPO,
        env={**env, "KUBECONFIG": str(kubeconfig)},
        stdout=logs["watcher"],
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{args.port}"
    try:
        try:
            wait_for_port(args.port, web)
            # The login printed below works at once: a worker has loaded Django.
            urllib.request.urlopen(f"{url}/readyz", timeout=CALL_TIMEOUT).close()
        except (RuntimeError, OSError) as exc:
            print(f"The web server did not start ({exc}); see {demo_dir}/web.log")
            return 1
        print(
            f"\nks-scheduler demo: {len(nodes)} simulated nodes, about "
            f"{args.rate:g} pipelines a second, for {args.minutes:g} minutes.\n"
            f"  Admin:    {url}/admin/\n"
            f"  Login:    {USERNAME} / {password}   (a new password every run)\n"
            f"  Pipeline: {url}/admin/pipeline/?q=jenkins-payments-java-api\n"
            "Placements appear within seconds; warmth, startup and run times and "
            "the time saved\nbuild up over the first minutes. Warmth as the ledger "
            f"records it: {demo_dir / 'demo.db'}, table history_placement.\n"
            f"{MADE_UP}\n"
            f"Logs: {demo_dir}/web.log, {demo_dir}/watcher.log. Ctrl-C stops.\n",
            flush=True,
        )
        simulation = Simulation(
            server=server,
            extender_url=url,
            nodes=nodes,
            capacity=8,
            rng=rng,
        )
        rng.shuffle(simulation.labels)
        deadline = time.monotonic() + args.minutes * 60
        next_report = time.monotonic() + 15
        while not stopping.is_set() and time.monotonic() < deadline:
            if watcher.poll() is not None:
                print(f"watch_pods stopped; see {demo_dir}/watcher.log")
                return 1
            started = time.monotonic()
            simulation.tick(args.rate)
            if time.monotonic() >= next_report:
                next_report += 15
                print(
                    f"{simulation.placed} pods placed, {len(simulation.running)} "
                    f"running; {warmth_line(ledger_warmth(demo_dir / 'demo.db'))}",
                    flush=True,
                )
            stopping.wait(max(0.0, 1.0 - (time.monotonic() - started)))
    finally:
        print("Stopping the demo ...", flush=True)
        stop(watcher)
        print(warmth_line(ledger_warmth(demo_dir / "demo.db")), flush=True)
        stop(web)
        server.stop()
        for log in logs.values():
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
