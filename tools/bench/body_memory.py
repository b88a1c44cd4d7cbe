"""Peak memory of an extender worker for the largest bodies it accepts (Linux only).

    python -m tools.bench.body_memory [--limit 16777216]

Starts `python -m kssched.serve` (3 web workers, 1 extender worker) on free loopback
ports, prints the idle resident memory of every process, then sends, one at a time, the
largest bodies of several shapes under `--limit` (KSSCHED_MAX_BODY_BYTES) to the
extender listener and prints the worker's peak resident memory (VmHWM) for each. The
worker is restarted between bodies so that each peak is its own.
"""

import argparse
import http.client
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from tests.servers import free_port, wait_for_port
from tools.bench import data

REPO = Path(__file__).resolve().parent.parent.parent
FIXTURES = REPO / "tests" / "fixtures"


def status_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def kib(pid: int, field: str) -> int:
    return int(status_of(pid)[field].split()[0])


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(status_of(int(entry.name))["PPid"]) == pid:
                    found.append(int(entry.name))
            except (OSError, KeyError):
                continue
    return found


def listener_of(pid: int) -> str:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return "extender" if b"KSSCHED_LISTENER=extender" in environ else "web"


def post(port: int, path: str, body: bytes) -> tuple[int, bytes, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    started = time.perf_counter()
    try:
        conn.request(
            "POST", path, body=body, headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        return response.status, response.read(), time.perf_counter() - started
    finally:
        conn.close()


def bodies(limit: int) -> list[tuple[str, str, bytes]]:
    """(description, path, body): the largest body of each shape under `limit`."""
    filter_path = "/scheduler/predicates/alwaystrue"
    prioritize_path = "/scheduler/priorities/pipeline"
    count = 50
    while len(data.request_body(count + 50, full_nodes=True)) <= limit:
        count += 50
    generated = data.request_body(count, full_nodes=True)

    recorded = orjson.loads((FIXTURES / "prioritize-nodes.json").read_bytes())
    node = recorded["Nodes"]["items"][0]
    copies = limit // (len(orjson.dumps(node)) + 1) - 2
    items = [
        {**node, "metadata": {**node["metadata"], "name": f"worker-{i}"}}
        for i in range(copies)
    ]
    while True:
        fixture = orjson.dumps(
            {"Pod": recorded["Pod"], "Nodes": {"metadata": {}, "items": items}}
        )
        if len(fixture) <= limit:
            break
        items.pop()

    def numbers(size: int) -> bytes:
        values = b",".join([b"1000"] * (size // 5))
        return b'{"Pod":{},"Nodes":{"items":[],"x":[' + values + b"]}}"

    return [
        ("full Nodes, tools/bench/data.py, filter", filter_path, generated),
        ("full Nodes, tools/bench/data.py, prioritize", prioritize_path, generated),
        ("full Nodes, recorded fixture, filter", filter_path, fixture),
        ("numbers, densest accepted, filter", filter_path, numbers(int(limit * 0.87))),
        ("numbers, at the limit, filter", filter_path, numbers(limit - 64)),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=16 * 2**20)
    options = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="kssched-body-memory-"))
    web, extender = free_port(), free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "SECRET_KEY": "bench-secret-key-not-for-production-0123456789",
        "DATA_PATH": str(workdir / "scheduler.db"),
        "KSSCHED_BIND": f"127.0.0.1:{web}",
        "KSSCHED_EXTENDER_BIND": f"127.0.0.1:{extender}",
        "KSSCHED_EXTENDER_WORKERS": "1",
        "WEB_CONCURRENCY": "3",
        "KSSCHED_MAX_BODY_BYTES": str(options.limit),
        "LOG_LEVEL": "WARNING",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True
    )
    log = open(workdir / "server.log", "wb")  # noqa: SIM115 - the child keeps it
    serve = subprocess.Popen(
        [sys.executable, "-m", "kssched.serve"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=log,
    )
    small = (FIXTURES / "prioritize-nodenames.json").read_bytes()
    prioritize = "/scheduler/priorities/pipeline"
    try:
        wait_for_port(web, serve)
        wait_for_port(extender, serve)
        masters = {listener_of(pid): pid for pid in children(serve.pid)}

        def extender_worker() -> int:
            (worker,) = children(masters["extender"])
            return worker

        for port in (web, extender):
            for _ in range(6):
                post(port, prioritize, small)
        time.sleep(1)
        processes = [serve.pid, *masters.values()]
        processes += [w for m in masters.values() for w in children(m)]
        total = sum(kib(pid, "VmRSS") for pid in processes)
        print(f"idle: {total / 1024:.0f} MiB in {len(processes)} processes")
        for pid in processes:
            role = "supervisor" if pid == serve.pid else listener_of(pid)
            print(f"  {pid:>7} {role:<10} {kib(pid, 'VmRSS') / 1024:5.0f} MiB")
        print(f"bodies up to {options.limit} bytes, one extender worker:")
        for description, path, body in bodies(options.limit):
            worker = extender_worker()
            idle = kib(worker, "VmRSS")
            status, answer, seconds = post(extender, path, body)
            peak = kib(worker, "VmHWM")
            ratio = (peak - idle) * 1024 / len(body)
            print(
                f"  {description:<44} {len(body) / 2**20:5.1f} MiB -> {status} in "
                f"{seconds:5.2f} s; peak {peak / 1024:4.0f} MiB "
                f"(idle {idle / 1024:3.0f}), (peak - idle) / body = {ratio:5.2f}"
            )
            os.kill(worker, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    fresh = extender_worker()
                except ValueError:
                    time.sleep(0.2)
                    continue
                if fresh != worker:
                    break
                time.sleep(0.2)
            for _ in range(3):
                post(extender, prioritize, small)
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
