"""A scripted watcher run: many pods through the fake API server, faults on the way.

`python -m tools.soak_watch --pods 1000` (or `make soak`) migrates a fresh SQLite
file (or uses DATABASE_URL), runs `manage.py watch_pods` as a subprocess against
tests/fakeapi/ in cluster mode, and drives pods through it: created, bound,
finished, relabelled and deleted, while injecting dropped and truncated streams,
410 Gone, silent streams, duplicate replays, 500s, a SIGKILL restart (with pods bound
and deleted while it is down) and a held database write lock. It ends with exact
expected counts or exits 1, prints the figures and writes them as JSON.

The watcher subprocess and the expected counts come from tests/watcher_process.py,
which the watcher tests share.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.fakeapi import (
    ClusterWatch,
    FakeApiServer,
    StatusAction,
    WatchAction,
    expired,
    make_node,
    make_pod,
    write_kubeconfig,
)
from tests.helpers import REPO
from tests.watcher_process import (
    WatcherProcess,
    expected_counts,
    hold_write_lock,
    ledger_uids,
    stored_counts,
    wait_until,
    watcher_env,
)

LABELS = [
    "jenkins-java-maven-1",
    "jenkins-java-gradle",
    "jenkins-go",
    "gitlab-node-14",
    "gitlab-node-16-a",
    "gitlab--python-3",
    "batch-etl",
]

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
    figures["command"] = "python -m tools.soak_watch " + " ".join(
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
