"""Two checkouts side by side: serial prioritize latency and webhook throughput.

    python -m tools.bench.side_by_side --before /tmp/sv-before [--rounds 5]
    DATABASE_URL=postgres://.../base python -m tools.bench.side_by_side --before ...

Each checkout serves from its own code (its `kssched/gunicorn_conf.py`, 2 workers
per listener) on its own database, loaded by `tools.bench.run --prepare` (100 000
KeyNode rows): SQLite files, or with DATABASE_URL the databases `<base>_before` and
`<base>_after` on that server. In alternating rounds, so that both see the same
machine noise, it measures serial prioritize calls (one at a time, on a connection
kept while the server keeps it open, as kube-scheduler's Go client does) at 100,
1 000 and 5 000 node names, and webhook reviews per second with 8 clients on the web
listener (each keeping its connection likewise, as the API server's client does).
`--new-connections` makes every call on a new connection instead. Prints the median
over rounds of each, and the ratio after / before.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.attacks import PRIORITIZE, Client
from tests.servers import free_port, wait_for_port
from tools.bench import data
from tools.bench.attacks import throughput

REPO = Path(__file__).resolve().parent.parent.parent
NAMES = (100, 1000, 5000)
CALLS = {100: 300, 1000: 150, 5000: 40}


def environment(repo: Path, workdir: Path, name: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(repo),
        "SECRET_KEY": "bench-secret-key-not-for-production-0123456789",
        "LOG_LEVEL": "WARNING",
        "DATA_PATH": str(workdir / f"{name}.db"),
        "PROMETHEUS_MULTIPROC_DIR": str(workdir / f"prom-{name}"),
    }
    if base := os.environ.get("DATABASE_URL"):
        env["DATABASE_URL"] = f"{base}_{name}"
    return env


def start(repo: Path, env: dict[str, str], workdir: Path, name: str):
    python = str(repo / ".venv" / "bin" / "python")
    if "DATABASE_URL" in env:
        database = env["DATABASE_URL"].rsplit("/", 1)
        subprocess.run(
            [
                "dropdb",
                "--if-exists",
                "-h",
                "127.0.0.1",
                "-p",
                "55432",
                "-U",
                "postgres",
                database[1],
            ],
            check=True,
        )
        subprocess.run(
            [
                "createdb",
                "-h",
                "127.0.0.1",
                "-p",
                "55432",
                "-U",
                "postgres",
                database[1],
            ],
            check=True,
        )
    subprocess.run(
        [python, "-m", "tools.bench.run", "--prepare"],
        cwd=repo,
        env=env,
        check=True,
        capture_output=True,
    )
    ports = {"extender": free_port(), "web": free_port()}
    processes = []
    for listener, port in ports.items():
        log = open(workdir / f"{name}-{listener}.log", "wb")  # noqa: SIM115
        processes.append(
            subprocess.Popen(
                [
                    python,
                    "-m",
                    "gunicorn",
                    "-c",
                    "kssched/gunicorn_conf.py",
                    "kssched.wsgi",
                ],
                cwd=repo,
                env={
                    **env,
                    "KSSCHED_LISTENER": listener,
                    "KSSCHED_BIND": f"127.0.0.1:{ports['web']}",
                    "KSSCHED_EXTENDER_BIND": f"127.0.0.1:{ports['extender']}",
                    "WEB_CONCURRENCY": "2",
                    "KSSCHED_EXTENDER_WORKERS": "2",
                },
                stdout=log,
                stderr=log,
            )
        )
        wait_for_port(port, processes[-1])
    return processes, ports


def serial_p50(port: int, body: bytes, calls: int, reuse: bool = True) -> float:
    caller, times = Client(port, reuse=reuse), []
    for _ in range(calls):
        status, seconds = caller.call("POST", PRIORITIZE, body)
        assert status == 200, status
        times.append(seconds)
    caller.close()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=REPO)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--new-connections",
        action="store_true",
        help="each call on a new connection, even where the server would keep it",
    )
    args = parser.parse_args(argv)
    reuse = not args.new_connections
    bodies = {n: data.request_body(n, full_nodes=False) for n in NAMES}
    results: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    servers = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        try:
            for name, repo in (("before", args.before), ("after", args.after)):
                env = environment(repo, workdir, name)
                servers[name] = start(repo, env, workdir, name)
            for _, ports in servers.values():  # warm every worker
                for n in NAMES:
                    serial_p50(ports["extender"], bodies[n], 10)
                throughput(ports["web"], 8, 1.0)
            for round_ in range(args.rounds):
                order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
                for name in order:
                    ports = servers[name][1]
                    for n in NAMES:
                        p50 = serial_p50(ports["extender"], bodies[n], CALLS[n], reuse)
                        results[name].setdefault(f"p50 {n} names", []).append(p50)
                    rate = throughput(ports["web"], 8, 3.0, reuse)
                    results[name].setdefault("webhook/s 8 clients", []).append(rate)
        finally:
            for processes, _ in servers.values():
                for process in processes:
                    process.terminate()
                    process.wait(30)
    print(f"{'measure':22s} {'before':>10s} {'after':>10s} {'after/before':>12s}")
    for measure in results["before"]:
        before = statistics.median(results["before"][measure])
        after = statistics.median(results["after"][measure])
        scale = 1000 if measure.startswith("p50") else 1
        unit = " ms" if scale == 1000 else "/s"
        print(
            f"{measure:22s} {before * scale:8.2f}{unit} {after * scale:8.2f}{unit}"
            f" {after / before:11.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
