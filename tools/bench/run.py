"""`make bench`: the extender under gunicorn, side by side with the floor.

    python -m tools.bench.run [--quick] [--backends sqlite,postgres]
                              [--out bench-results/latest.json]

Starts servers on loopback ports, all with kssched/gunicorn_conf.py as the extender
listener (KSSCHED_LISTENER=extender, as kube-scheduler reaches it): ks-scheduler
itself (against a fresh database holding 100 000 KeyNode rows: SQLite by default,
DATABASE_URL when set; `--backends sqlite,postgres` runs both, the PostgreSQL one
on DATABASE_URL, and prints them side by side) and the floor app
(tools/bench/floor.py). For filter and prioritize, at 100, 1000 and 5000 nodes,
with node names and with full Node objects, it measures:

- serial latency (p50, p90, p99), one request at a time as kube-scheduler sends
  them, each on a new connection (sync workers answer `Connection: close`);
- throughput with 8 clients at once.

The floor and the servers (both backends with `--backends`, all running at once)
are measured in alternating rounds so that all of them see the same machine noise;
every figure is reported as a ratio to the floor, and PostgreSQL's also as a ratio
to SQLite's. The table goes to
stdout and everything to a JSON file.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from tests.servers import free_port, wait_for_port
from tools.bench import data

REPO = Path(__file__).resolve().parent.parent.parent
FILTER_PATH = "/scheduler/predicates/alwaystrue"
PRIORITIZE_PATH = "/scheduler/priorities/pipeline"
CONCURRENCY = 8
ROUNDS = 10

# (mode, nodes): (serial iterations, concurrent requests). A 5000 full-node body is
# about 70 MB, so those cases run only a few times.
ITERATIONS = {
    ("names", 100): (2000, 2000),
    ("names", 1000): (1000, 1000),
    ("names", 5000): (400, 400),
    ("nodes", 100): (200, 160),
    ("nodes", 1000): (40, 24),
    ("nodes", 5000): (6, 8),
}

# (verb, mode, nodes) -> the most p50 may be, as a multiple of the floor's p50.
TARGETS = {
    ("prioritize", "names", 100): 2.5,
    ("prioritize", "names", 1000): 1.5,
    ("prioritize", "names", 5000): 1.5,
    ("filter", "nodes", 1000): 1.3,
    ("prioritize", "nodes", 1000): 1.3,
}
P99_OVER_P50 = 3.0


@dataclass
class Stats:
    n: int
    p50: float
    p90: float
    p99: float
    mean: float
    rps: float = 0.0


@dataclass
class Case:
    verb: str
    mode: str
    nodes: int
    body_bytes: int
    app: Stats | None = None
    floor: Stats | None = None
    target: float | None = None
    checks: dict = field(default_factory=dict)


# --- client ---------------------------------------------------------------------------


def build_request(path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost:8080\r\n"
        f"User-Agent: kube-scheduler-bench\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def call(port: int, request: bytes, keep: bool = False) -> tuple[int, bytes | None]:
    """Send one request on a new connection; return (status, body if `keep`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request)
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed before the headers")
            buffer += chunk
        head, _, rest = buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length is None:
            chunks = [rest]
            while chunk := sock.recv(1 << 20):
                chunks.append(chunk)
            body = b"".join(chunks)
        else:
            body_buffer = bytearray(length)
            view = memoryview(body_buffer)
            view[: len(rest)] = rest
            got = len(rest)
            while got < length:
                received = sock.recv_into(view[got:], min(length - got, 1 << 22))
                if not received:
                    raise ConnectionError("connection closed mid-body")
                got += received
            body = bytes(body_buffer) if keep else None
        return status, body if keep else None


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = round(fraction * len(sorted_values))
    index = min(len(sorted_values) - 1, max(0, rank - 1))
    return sorted_values[index]


def serial(port: int, request: bytes, count: int) -> list[float]:
    timings = []
    for _ in range(count):
        started = time.perf_counter()
        status, _ = call(port, request)
        timings.append(time.perf_counter() - started)
        if status != 200:
            raise RuntimeError(f"status {status}")
    return timings


def concurrent(port: int, request: bytes, total: int) -> float:
    """Requests per second with CONCURRENCY clients sending `total` requests."""
    remaining = [total]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker():
        while True:
            with lock:
                if remaining[0] <= 0:
                    return
                remaining[0] -= 1
            try:
                status, _ = call(port, request)
                if status != 200:
                    raise RuntimeError(f"status {status}")
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=worker) for _ in range(CONCURRENCY)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"concurrent run failed: {errors[0]!r}")
    return total / elapsed


def stats(timings: list[float], rps: float) -> Stats:
    ordered = sorted(timings)
    ms = 1000.0
    return Stats(
        n=len(ordered),
        p50=percentile(ordered, 0.50) * ms,
        p90=percentile(ordered, 0.90) * ms,
        p99=percentile(ordered, 0.99) * ms,
        mean=statistics.fmean(ordered) * ms,
        rps=rps,
    )


# --- servers --------------------------------------------------------------------------


def start_gunicorn(app: str, env: dict, log_path: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    # The extender listener, as kube-scheduler reaches it (kssched.serve).
    env = {
        **env,
        "KSSCHED_LISTENER": "extender",
        "KSSCHED_EXTENDER_BIND": f"127.0.0.1:{port}",
    }
    log = open(log_path, "ab")  # noqa: SIM115 - the child keeps it
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            str(REPO / "kssched" / "gunicorn_conf.py"),
            app,
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        wait_for_port(port, process)
    except (RuntimeError, TimeoutError) as exc:
        process.kill()
        raise RuntimeError(f"{app} did not start; see {log_path}") from exc
    return process, port


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def server_env(workdir: Path) -> dict:
    # As the shipped manifests run it: metrics shared by the workers through files.
    metrics_dir = workdir / "prometheus"
    env = {
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "SECRET_KEY": "bench-secret-key-not-for-production-0123456789",
        "DEBUG": "0",
        "LOG_LEVEL": "WARNING",
        "DATA_PATH": str(workdir / "scheduler.db"),
        # 5000 full Node objects are 69 MB, over the default limit, and eight of them
        # at once take longer to arrive than the default 2 s read deadline.
        "KSSCHED_MAX_BODY_BYTES": str(128 * 2**20),
        "KSSCHED_EXTENDER_READ_TIMEOUT": "30",
    }
    for name in (
        "DATABASE_URL",
        "KSSCHED_EXTENDER_WORKERS",
        "KSSCHED_SCORING",
        "KSSCHED_WORKSPACE_DEPTH",
    ):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def prepare_database(env: dict) -> str:
    """Migrate a fresh database and load the benchmark history, in a subprocess
    (one Django set-up per backend); return its vendor."""
    result = subprocess.run(
        [sys.executable, "-m", "tools.bench.run", "--prepare"],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip().splitlines()[-1]


def prepare_here() -> str:
    """`prepare_database` inside this process, from its environment."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "kssched.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections

    from history.models import KeyNode

    call_command("migrate", verbosity=0, interactive=False)
    KeyNode.objects.all().delete()
    KeyNode.objects.bulk_create(
        (KeyNode(key=k, node=n, count=c) for k, n, c in data.keynode_rows()),
        batch_size=2000,
    )
    if connection.vendor == "postgresql":
        # Loading left dead rows in the history and its change log: vacuumed now,
        # so autovacuum does not run during the measurements (steady state).
        with connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE)")
    else:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    vendor = connection.vendor
    connections.close_all()
    return vendor


# --- the run --------------------------------------------------------------------------


def check_answer(verb: str, body: bytes, count: int) -> None:
    answer = orjson.loads(body)
    if verb == "filter":
        got = answer["NodeNames"] or answer["Nodes"]["items"]
    else:
        got = answer
        scores = {row["Score"] for row in answer}
        if not scores <= set(range(11)):
            raise RuntimeError(f"implausible scores {sorted(scores)}")
    if len(got) != count:
        raise RuntimeError(f"{verb} answered {len(got)} nodes, expected {count}")


def measure(
    cases: dict[str, Case],
    request: bytes,
    app_ports: dict[str, int],
    floor_port: int,
    quick: bool,
):
    """One case on every server: the floor and each backend serve alternating
    rounds (in turn first), so all of them see the same machine noise."""
    case = next(iter(cases.values()))
    serial_n, concurrent_n = ITERATIONS[(case.mode, case.nodes)]
    if quick:
        serial_n, concurrent_n = max(5, serial_n // 20), max(8, concurrent_n // 20)
    ports = {"floor": floor_port, **app_ports}
    for port in ports.values():
        status, body = call(port, request, keep=True)
        if status != 200:
            raise RuntimeError(f"{case.verb} answered {status}: {body[:300]!r}")
        check_answer(case.verb, body, case.nodes)
        del body
        serial(port, request, min(10, serial_n))  # warm up
    times: dict[str, list[float]] = {name: [] for name in ports}
    per_round = max(1, serial_n // ROUNDS)
    order = list(ports)
    for _ in range(ROUNDS):
        for name in order:
            times[name] += serial(ports[name], request, per_round)
        order = order[1:] + order[:1]
    floor = stats(times["floor"], concurrent(floor_port, request, concurrent_n))
    for vendor, case in cases.items():
        app_rps = concurrent(app_ports[vendor], request, concurrent_n)
        case.floor = floor
        case.app = stats(times[vendor], app_rps)
        case.target = TARGETS.get((case.verb, case.mode, case.nodes))
        ratio = case.app.p50 / case.floor.p50
        case.checks = {
            "p50_ratio": round(ratio, 3),
            "p99_over_p50": round(case.app.p99 / case.app.p50, 3),
            "p50_target_met": None if case.target is None else ratio <= case.target,
            "p99_target_met": case.app.p99 <= P99_OVER_P50 * case.app.p50,
        }


def machine() -> dict:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
    }


def fmt_ms(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def table(cases: list[Case]) -> str:
    header = (
        f"{'verb':<10} {'mode':<5} {'nodes':>5} {'body':>8} {'n':>5} | "
        f"{'p50 ms':>8} {'floor':>7} {'ratio':>5} | {'p90':>7} {'p99':>7} "
        f"{'p99/50':>6} | {'req/s':>7} {'floor':>7} {'ratio':>5} | target"
    )
    lines = [header, "-" * len(header)]
    for c in cases:
        a, f = c.app, c.floor
        body = (
            f"{c.body_bytes / 1e6:.1f}MB"
            if c.body_bytes >= 1e6
            else f"{c.body_bytes / 1e3:.0f}KB"
        )
        if c.target is None:
            verdict = "-"
        else:
            verdict = f"<={c.target}x " + (
                "met" if c.checks["p50_target_met"] else "MISSED"
            )
        if not c.checks["p99_target_met"]:
            verdict += " p99 MISSED"
        lines.append(
            f"{c.verb:<10} {c.mode:<5} {c.nodes:>5} {body:>8} {a.n:>5} | "
            f"{fmt_ms(a.p50):>8} {fmt_ms(f.p50):>7} {a.p50 / f.p50:>5.2f} | "
            f"{fmt_ms(a.p90):>7} {fmt_ms(a.p99):>7} {a.p99 / a.p50:>6.2f} | "
            f"{a.rps:>7.1f} {f.rps:>7.1f} {a.rps / f.rps:>5.2f} | {verdict}"
        )
    return "\n".join(lines)


def run_backends(
    backends: dict[str, dict], workdir: Path, options, floor_port: int
) -> dict[str, list[Case]]:
    """Every case against one ks-scheduler server per backend (vendor -> its
    environment), all running at once and measured in the same rounds."""
    servers: dict[str, subprocess.Popen] = {}
    ports: dict[str, int] = {}
    results: dict[str, list[Case]] = {vendor: [] for vendor in backends}
    try:
        for vendor, env in backends.items():
            servers[vendor], ports[vendor] = start_gunicorn(
                "kssched.wsgi", env, workdir / f"app-{vendor}.log"
            )
        for mode in ("names", "nodes"):
            for nodes in (100, 1000, 5000):
                body = data.request_body(nodes, full_nodes=mode == "nodes")
                for verb, path in (
                    ("filter", FILTER_PATH),
                    ("prioritize", PRIORITIZE_PATH),
                ):
                    name = f"{verb}:{mode}:{nodes}"
                    if options.only and not any(
                        name.startswith(part) for part in options.only.split(",")
                    ):
                        continue
                    cases = {
                        vendor: Case(
                            verb=verb, mode=mode, nodes=nodes, body_bytes=len(body)
                        )
                        for vendor in backends
                    }
                    print(f"  {name} ...", flush=True)
                    measure(
                        cases,
                        build_request(path, body),
                        ports,
                        floor_port,
                        options.quick,
                    )
                    for vendor, case in cases.items():
                        results[vendor].append(case)
                del body
    finally:
        for server in servers.values():
            stop(server)
    return results


# PostgreSQL beside SQLite in one run: p50 at most this multiple of SQLite's.
POSTGRES_OVER_SQLITE = 1.3


def side_by_side(results: dict[str, list[Case]]) -> tuple[str, int, int]:
    """SQLite and PostgreSQL per case, with the floor; (table, met, targets)."""
    sqlite = {(c.verb, c.mode, c.nodes): c for c in results["sqlite"]}
    header = (
        f"{'verb':<10} {'mode':<5} {'nodes':>5} | {'floor':>7} | {'sqlite':>7} "
        f"{'p99':>7} | {'pg p50':>7} {'p99':>7} {'p99/50':>6} | {'pg/sqlite':>9} | "
        f"target"
    )
    lines = [header, "-" * len(header)]
    met = targets = 0
    for c in results["postgresql"]:
        s = sqlite.get((c.verb, c.mode, c.nodes))
        if s is None:
            continue
        ratio = c.app.p50 / s.app.p50
        verdict = "-"
        if c.verb == "prioritize" and c.mode == "names":
            targets += 1
            ok = ratio <= POSTGRES_OVER_SQLITE and c.checks["p99_target_met"]
            met += ok
            verdict = f"<={POSTGRES_OVER_SQLITE}x sqlite " + ("met" if ok else "MISSED")
        elif c.target is not None:
            targets += 1
            met += bool(c.checks["p50_target_met"])
            verdict = f"<={c.target}x floor " + (
                "met" if c.checks["p50_target_met"] else "MISSED"
            )
        lines.append(
            f"{c.verb:<10} {c.mode:<5} {c.nodes:>5} | {fmt_ms(c.floor.p50):>7} | "
            f"{fmt_ms(s.app.p50):>7} {fmt_ms(s.app.p99):>7} | "
            f"{fmt_ms(c.app.p50):>7} {fmt_ms(c.app.p99):>7} "
            f"{c.app.p99 / c.app.p50:>6.2f} | {ratio:>9.2f} | {verdict}"
        )
    return "\n".join(lines), met, targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few iterations")
    parser.add_argument("--out", default=str(REPO / "bench-results" / "latest.json"))
    parser.add_argument(
        "--only", default="", help="comma list of case filters, e.g. prioritize:names"
    )
    parser.add_argument(
        "--backends",
        default="",
        help="sqlite,postgres: both in one run (PostgreSQL from DATABASE_URL)",
    )
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.prepare:
        print(prepare_here())
        return 0

    workdir = Path(tempfile.mkdtemp(prefix="kssched-bench-"))
    env = server_env(workdir)
    backends = [b.strip() for b in options.backends.split(",") if b.strip()]
    if backends and "postgres" in backends and not env.get("DATABASE_URL"):
        print("--backends postgres needs DATABASE_URL=postgres://...", file=sys.stderr)
        return 2
    started = time.monotonic()
    floor_env = {k: v for k, v in env.items() if k != "DATABASE_URL"}
    floor_env["PROMETHEUS_MULTIPROC_DIR"] = str(workdir / "prometheus-floor")
    floor, floor_port = start_gunicorn(
        "tools.bench.floor:application", floor_env, workdir / "floor.log"
    )
    runs: list[dict] = []
    for backend in backends:
        backend_env = dict(env)
        if backend == "sqlite":
            backend_env.pop("DATABASE_URL", None)
        backend_env["DATA_PATH"] = str(workdir / f"{backend}.db")
        backend_env["PROMETHEUS_MULTIPROC_DIR"] = str(workdir / f"prom-{backend}")
        runs.append(backend_env)
    try:
        backends: dict[str, dict] = {}
        for backend_env in runs or [env]:
            print(f"Loading {data.KEYNODE_ROWS} KeyNode rows ...", flush=True)
            backends[prepare_database(backend_env)] = backend_env
        print(f"Measuring on {', '.join(backends)} ...", flush=True)
        results = run_backends(backends, workdir, options, floor_port)
    finally:
        stop(floor)

    info = machine()
    info["database"] = ",".join(results)
    info["scoring"] = env.get("KSSCHED_SCORING") or "default (KSSCHED_SCORING unset)"
    info["workers"] = (
        int(env.get("KSSCHED_EXTENDER_WORKERS", "0")) or "gunicorn_conf default"
    )
    texts = {}
    for vendor, cases in results.items():
        texts[vendor] = table(cases)
        print()
        print(
            f"ks-scheduler bench: {info['nproc']} x {info['cpu']}, "
            f"Python {info['python']}, "
            f"{vendor} ({data.KEYNODE_ROWS} KeyNode rows), scoring "
            f"{info['scoring']}, serial p50 over one connection at a time, "
            f"throughput at concurrency {CONCURRENCY}; ratio = ks-scheduler / "
            f"floor (bare orjson WSGI app, same gunicorn config)"
        )
        print(texts[vendor])
        targets = [c for c in cases if c.target is not None]
        met = sum(1 for c in targets if c.checks["p50_target_met"])
        p99_met = sum(1 for c in cases if c.checks["p99_target_met"])
        print(
            f"\np50 targets met: {met}/{len(targets)}; "
            f"p99 <= {P99_OVER_P50}x p50: {p99_met}/{len(cases)}"
        )
    if {"sqlite", "postgresql"} <= results.keys():
        text, met, targets = side_by_side(results)
        texts["side_by_side"] = text
        print("\nPostgreSQL beside SQLite (p50/p99 in ms):")
        print(text)
        print(f"\nPostgreSQL targets met: {met}/{targets}")
    print(f"took {time.monotonic() - started:.0f} s")
    out = Path(options.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(
        orjson.dumps(
            {
                "machine": info,
                "concurrency": CONCURRENCY,
                "keynode_rows": data.KEYNODE_ROWS,
                "label": data.PIPELINE_LABEL,
                "cases": {
                    vendor: [asdict(c) for c in cases]
                    for vendor, cases in results.items()
                },
                "tables": texts,
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    print(f"JSON written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
