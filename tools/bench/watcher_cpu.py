"""The watcher's CPU per 100 pod lifecycles, without a control plane.

    python -m tools.bench.watcher_cpu                  # 300 pods, SQLite, 3 runs
    python -m tools.bench.watcher_cpu --pods 300 --runs 5 --profile /tmp/watcher.prof
    DATABASE_URL=postgres://... python -m tools.bench.watcher_cpu   # PostgreSQL

Starts the real `manage.py watch_pods` against tests/fakeapi (the local test API
server) on a fresh SQLite file (or the PostgreSQL database of DATABASE_URL, emptied
first by `manage.py flush`), lets it settle, then plays each pod's life: created,
bound to one of 10 nodes (Running), Succeeded; with `--pace`, the bindings come
one at a time, as kube-scheduler makes them. Reports the watcher's CPU seconds
(utime + stime from /proc) per 100 pods for each run and their median, and, from
the profile of the last run, the SQL statements and commits per pod. With
`--profile`, the watcher runs under cProfile and the profile is saved there (the
profiler itself costs CPU: compare figures with and without it, not across).

A quick proxy for `make bench-e2e` (tools/bench/e2e.py), which measures the same on
a real control plane; the figures are close but not the same (TLS, Event writes to
a real API server, the scheduler's own status updates).
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.fakeapi import FakeApiServer, write_kubeconfig  # noqa: E402
from tests.fakeapi.objects import make_node, make_pod  # noqa: E402

NODES = 10
LABELS = 50


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def query(env: dict[str, str], expression: str) -> int:
    """An integer the watcher's database gives (read in a separate process)."""
    code = (
        "import django; django.setup(); "
        f"from history.models import Placement, WatchState; print({expression})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**env, "DJANGO_SETTINGS_MODULE": "kssched.settings"},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.strip() or 0)


def wait_for(env: dict[str, str], expression: str, target: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while query(env, expression) < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{expression} did not reach {target} in {timeout} s")
        time.sleep(0.5)


def one_run(
    pods: int, *, settle: float, profile: Path | None, pace: float = 0.0
) -> float:
    """CPU seconds per 100 pods of one watcher run."""
    tmp = Path(tempfile.mkdtemp(prefix="watcher-cpu-"))
    env = dict(
        os.environ,
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench"),
        DATA_PATH=str(tmp / "db.sqlite3"),
        KSSCHED_HEARTBEAT_PATH=str(tmp / "heartbeat"),
        KSSCHED_WATCHER_METRICS_BIND="",
    )
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], cwd=REPO, env=env, check=True)
    if env.get("DATABASE_URL"):
        subprocess.run(
            [*manage, "flush", "--no-input", "-v0"], cwd=REPO, env=env, check=True
        )
    with FakeApiServer() as server:
        kubeconfig = write_kubeconfig(tmp, server.url)
        for i in range(NODES):
            server.add_node(make_node(f"node{i}"))
        prefix = (
            [sys.executable, "-m", "cProfile", "-o", str(profile)]
            if profile
            else [sys.executable]
        )
        process = subprocess.Popen(
            [*prefix, "manage.py", "watch_pods", "--kubeconfig", str(kubeconfig)],
            cwd=REPO,
            env=env,
        )
        try:
            # Watching: the pod stream has listed and saved its resourceVersion.
            watching = (
                "WatchState.objects.filter(name='pods').exclude(resource_version='')"
                ".count()"
            )
            wait_for(env, watching, 1, timeout=120)
            idle = cpu_seconds(process.pid)
            time.sleep(settle)
            before = cpu_seconds(process.pid)
            print(
                f"idle: {(before - idle) / settle:.4f} CPU s per second",
                file=sys.stderr,
            )
            for i in range(pods):
                server.add_pod(make_pod(f"p{i}", label=f"team-app{i % LABELS}-build"))
            for i in range(pods):
                server.bind_pod(f"p{i}", f"node{i % NODES}")
                if pace:
                    time.sleep(pace)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            finished = {
                "status": {
                    "phase": "Succeeded",
                    "containerStatuses": [
                        {
                            "name": "step",
                            "state": {
                                "terminated": {
                                    "startedAt": stamp,
                                    "finishedAt": stamp,
                                    "exitCode": 0,
                                }
                            },
                        }
                    ],
                }
            }
            for i in range(pods):
                server.modify_pod(f"p{i}", finished)
            ended = "Placement.objects.filter(finished_at__isnull=False).count()"
            wait_for(env, ended, pods, timeout=300)
            time.sleep(1)  # the last Event writes
            used = cpu_seconds(process.pid) - before
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(60)
    return used / pods * 100


def sql_per_pod(profile: Path, pods: int) -> str:
    """Statements and commits per pod, from the profile's call counts."""
    stats = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    executes = commits = 0
    for (file, _line, func), (_cc, calls, *_rest) in stats.items():
        if file.endswith("django/db/backends/utils.py") and func == "_execute":
            executes += calls
        if file.endswith("django/db/backends/base/base.py") and func == "_commit":
            commits += calls
    return (
        f"SQL statements per pod: {executes / pods:.1f}, "
        f"commits per pod: {commits / pods:.2f} (whole run, start-up included)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--settle",
        type=float,
        default=3.0,
        help="Seconds between the watcher's first watch and the measurement.",
    )
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="Seconds between two bindings (kube-scheduler binds one pod at a "
        "time: 0.02 is 50 pods/s); 0 binds them all at once.",
    )
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--top", type=int, default=0, help="Print the profile's top N.")
    options = parser.parse_args()
    figures = []
    for run in range(options.runs):
        figure = one_run(
            options.pods,
            settle=options.settle,
            profile=options.profile,
            pace=options.pace,
        )
        figures.append(figure)
        print(f"run {run + 1}: {figure:.3f} CPU s per 100 pods", flush=True)
    print(
        f"median of {len(figures)}: {statistics.median(figures):.3f} CPU s per 100 pods"
        f" ({'PostgreSQL' if os.environ.get('DATABASE_URL') else 'SQLite'}, "
        f"{options.pods} pods)"
    )
    if options.profile:
        print(sql_per_pod(options.profile, options.pods))
        if options.top:
            pstats.Stats(str(options.profile)).sort_stats("tottime").print_stats(
                options.top
            )


if __name__ == "__main__":
    main()
