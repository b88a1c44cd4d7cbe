"""Prioritize latency while stalled clients hold connections to the pod port.

    python -m tools.bench.slow_clients [--stalled 20] [--seconds 60] [--one-listener]

Starts ks-scheduler as deployed (`python -m kssched.serve`: the web listener and the
loopback extender listener, each with its own workers) on free loopback ports, opens
`--stalled` connections to the web listener that send half a request head and stall,
and while they are held sends prioritize calls (the recorded kube-scheduler body) to
the extender listener one at a time, as kube-scheduler does. Prints p50/p99/max and
how many calls timed out (`--call-timeout`, default 30 s).

`--one-listener` runs a single gunicorn instead (`gunicorn -c kssched/gunicorn_conf.py
kssched.wsgi`, how ks-scheduler was served before the listeners were split) and sends
the calls to that same port. `--repo` points at another checkout to measure its code.
"""

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.servers import free_port, wait_for_port

REPO = Path(__file__).resolve().parent.parent.parent
PARTIAL = b"POST /scheduler/priorities/pipeline HTTP/1.1\r\nHost: localhost\r\nCont"


def start(repo: Path, one_listener: bool, workdir: Path):
    web, extender = free_port(), free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(repo),
        "SECRET_KEY": "bench-secret-key-not-for-production-0123456789",
        "DATA_PATH": str(workdir / "scheduler.db"),
        "KSSCHED_BIND": f"127.0.0.1:{web}",
        "KSSCHED_EXTENDER_BIND": f"127.0.0.1:{extender}",
        "LOG_LEVEL": "WARNING",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=repo, env=env, check=True
    )
    if one_listener:
        command = ["-m", "gunicorn", "-c", "kssched/gunicorn_conf.py", "kssched.wsgi"]
        ports = [web]
    else:
        command = ["-m", "kssched.serve"]
        ports = [web, extender]
    log = open(workdir / "server.log", "wb")  # noqa: SIM115 - the child keeps it
    process = subprocess.Popen(
        [sys.executable, *command], cwd=repo, env=env, stdout=log, stderr=log
    )
    for port in ports:
        wait_for_port(port, process)
    return process, web, (web if one_listener else extender)


def prioritize(port: int, body: bytes, timeout: float) -> float | None:
    """Seconds one call took, or None if it timed out or failed."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/scheduler/priorities/pipeline",
            body=body,
            headers={"Content-Type": "application/json", "Host": "localhost"},
        )
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            return None
        return time.perf_counter() - started
    except OSError:
        return None
    finally:
        conn.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stalled", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--call-timeout", type=float, default=30)
    parser.add_argument("--one-listener", action="store_true")
    parser.add_argument("--repo", type=Path, default=REPO)
    options = parser.parse_args(argv)

    body = (REPO / "tests" / "fixtures" / "prioritize-nodenames.json").read_bytes()
    workdir = Path(tempfile.mkdtemp(prefix="kssched-slow-clients-"))
    process, web, target = start(options.repo.resolve(), options.one_listener, workdir)
    held = []
    try:
        for _ in range(20):
            prioritize(target, body, 10)
        calm = [prioritize(target, body, 10) for _ in range(200)]
        for _ in range(options.stalled):
            sock = socket.create_connection(("127.0.0.1", web), timeout=10)
            sock.sendall(PARTIAL)
            held.append(sock)
        time.sleep(0.5)
        attacked, timeouts = [], 0
        until = time.monotonic() + options.seconds
        while time.monotonic() < until:
            seconds = prioritize(target, body, options.call_timeout)
            if seconds is None:
                timeouts += 1
            else:
                attacked.append(seconds)
    finally:
        for sock in held:
            sock.close()
        process.terminate()
        process.wait(timeout=60)

    def line(name, values, failed=0):
        if not values:
            return f"{name:<34} n={0:>5}  failed={failed}"
        values = sorted(values)
        p50 = statistics.median(values)
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        return (
            f"{name:<34} n={len(values):>5}  p50={p50 * 1000:9.2f} ms"
            f"  p99={p99 * 1000:9.2f} ms  max={values[-1] * 1000:9.2f} ms  "
            f"failed={failed}"
        )

    mode = "one listener" if options.one_listener else "two listeners"
    print(f"{mode}, {options.stalled} stalled connections on the web listener")
    print(line("before the stall", [v for v in calm if v is not None]))
    print(line(f"during the stall ({options.seconds:.0f} s)", attacked, timeouts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
