"""`make demo`: ks-scheduler on a simulated cluster, no Kubernetes needed.

Runs the real parts against the test API server (tests/fakeapi/):

- the extender and admin under gunicorn, on 127.0.0.1 only;
- `manage.py watch_pods`, which lists and watches the simulated pods and records
  each placement, exactly as in a cluster;
- a driver in this process that plays kube-scheduler and the kubelets: pipeline pods
  arrive (with fan-out bursts), each is scored by calling the real prioritize endpoint
  and bound to the best node (extender score × weight × 10 plus a least-allocated
  score, as kube-scheduler adds them), runs for a while and finishes.

Its database lives in var/demo/ and starts empty on every run; `make run`'s history is
left alone. It stops after --minutes or on Ctrl-C (SIGINT/SIGTERM), stopping its
children. Standard library only in this process: Django runs in the children.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tests.fakeapi import FakeApiServer, make_node, make_pod, write_kubeconfig
from tests.servers import wait_for_port

REPO = Path(__file__).resolve().parent.parent
USERNAME = "demo"
# kube-scheduler adds score × weight × 10; deploy/ ships weight 5.
EXTENDER_WEIGHT = 5
# Pipelines from general to specific; each project label gets popularity by Zipf.
SYSTEMS = {
    "jenkins": {"java": ["maven", "gradle"], "python": ["pytest", "tox"]},
    "gitlab": {"go": ["build", "lint"], "node": ["npm", "yarn"]},
    "tekton": {"rust": ["cargo"], "java": ["maven"]},
}
PROJECTS_PER_TOOL = 3


def pipeline_labels() -> list[str]:
    labels = []
    for system, languages in SYSTEMS.items():
        for language, tools in languages.items():
            for tool in tools:
                for number in range(1, PROJECTS_PER_TOOL + 1):
                    labels.append(f"{system}-{language}-{tool}-app{number}")
    return labels


@dataclass
class RunningPod:
    name: str
    node: str
    ends_at: float


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
    warm: int = 0
    number: int = 0

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
        with urllib.request.urlopen(request, timeout=5) as answer:
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
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {"type": "PodScheduled", "status": "True"}
        self.server.modify_pod(
            name,
            {
                "spec": {"nodeName": node},
                "status": {
                    "phase": "Running",
                    "conditions": [{**condition, "lastTransitionTime": now}],
                },
            },
        )
        self.placed += 1
        self.warm += scores.get(node, 0) > 1
        runtime = self.rng.uniform(20, 120)
        self.running.append(RunningPod(name, node, time.monotonic() + runtime))

    def finish_due(self) -> None:
        """Pods whose run is over succeed (or fail, now and then) and are deleted."""
        now = time.monotonic()
        due = [pod for pod in self.running if pod.ends_at <= now]
        self.running = [pod for pod in self.running if pod.ends_at > now]
        for pod in due:
            phase = "Failed" if self.rng.random() < 0.05 else "Succeeded"
            self.server.modify_pod(pod.name, {"status": {"phase": phase}})
            self.server.delete_pod(pod.name)

    def tick(self, rate: float) -> None:
        """One second of the cluster: arrivals (sometimes a fan-out) and endings."""
        self.finish_due()
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
        "SECRET_KEY": secret_key,
        "DATA_PATH": str(demo_dir / "demo.db"),
        "KSSCHED_HEARTBEAT_PATH": str(demo_dir / "watcher" / "heartbeat"),
        "KSSCHED_WATCHER_METRICS_PORT": "0",
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
        except (RuntimeError, TimeoutError) as exc:
            print(f"The web server did not start ({exc}); see {demo_dir}/web.log")
            return 1
        print(
            f"\nks-scheduler demo: {len(nodes)} simulated nodes, about "
            f"{args.rate:g} pipelines a second, for {args.minutes:g} minutes.\n"
            f"  Admin:    {url}/admin/\n"
            f"  Login:    {USERNAME} / {password}   (a new password every run)\n"
            f"  Pipeline: {url}/admin/pipeline/?q=jenkins-java-maven\n"
            "Placements appear within seconds; warmth builds up over a minute or "
            f"two.\nLogs: {demo_dir}/web.log, {demo_dir}/watcher.log. Ctrl-C stops.\n",
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
                warm = simulation.warm / max(simulation.placed, 1)
                print(
                    f"{simulation.placed} pods placed, {len(simulation.running)} "
                    f"running, {warm:.0%} on a warm node",
                    flush=True,
                )
            stopping.wait(max(0.0, 1.0 - (time.monotonic() - started)))
    finally:
        print("Stopping the demo ...", flush=True)
        stop(watcher)
        stop(web)
        server.stop()
        for log in logs.values():
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
