"""Every slow-client attack of tests/attacks.py, on both listeners and on the TLS
web port, as a table; `--repo` serves another checkout, to compare side by side.

    python -m tools.bench.attacks [--repo /tmp/sv-before] [--seconds 4]
    python -m tools.bench.attacks --throughput 8   # webhook calls/s, 8 clients

Starts `python -m kssched.serve` from `--repo` (its own code, this checkout's
attackers) with SQLite unless DATABASE_URL is set, and prints for each listener the
baseline and, per attack, honest calls, failures, p50 and its ratio to the baseline,
probes answered, and whether a worker was restarted.
"""

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.attacks import (
    ATTACKS,
    PRIORITIZE,
    TLS_ATTACKS,
    WEBHOOK,
    Client,
    attack,
    kinds,
    measure,
    request,
)
from tests.servers import free_port, wait_for_port
from tools.bench.stalls import REVIEW, make_pki

REPO = Path(__file__).resolve().parent.parent.parent
PRIORITIZE_BODY = (
    REPO / "tests" / "fixtures" / "prioritize-nodenames.json"
).read_bytes()


def start(repo: Path, workdir: Path, extra: dict[str, str], log: str):
    web, extender = free_port(), free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(repo),
        "SECRET_KEY": "bench-secret-key-not-for-production-0123456789",
        "DATA_PATH": str(workdir / "scheduler.db"),
        "KSSCHED_BIND": f"127.0.0.1:{web}",
        "KSSCHED_EXTENDER_BIND": f"127.0.0.1:{extender}",
        **extra,
    }
    if os.environ.get("DATABASE_URL"):
        env["DATABASE_URL"] = os.environ["DATABASE_URL"]
    python = str(repo / ".venv" / "bin" / "python")
    subprocess.run(
        [python, "manage.py", "migrate", "-v0"], cwd=repo, env=env, check=True
    )
    out = open(workdir / log, "wb")  # noqa: SIM115 - the child keeps it
    process = subprocess.Popen(
        [python, "-m", "kssched.serve"], cwd=repo, env=env, stdout=out, stderr=out
    )
    for port in (web, extender):
        wait_for_port(port, process)
    return process, web, extender


def stop(process: subprocess.Popen, workdir: Path, log: str) -> str:
    process.terminate()
    process.wait(30)
    text = (workdir / log).read_text(errors="replace")
    # Both listeners' masters boot 2 workers each at start (WEB_CONCURRENCY is 3
    # unless set: counted as booted, then any more is a restart).
    return (
        f"{text.count('WORKER TIMEOUT')} worker timeouts,"
        f" {text.count('Booting worker')} workers booted"
    )


def table(name, port, attacks, sent, honest, probe, seconds, context=None) -> None:
    for _ in range(5):
        honest(timeout=30)
    base = measure(honest, probe, seconds)
    print(f"\n{name}: baseline {base.row()}", flush=True)
    for attack_name, groups in attacks.items():
        under, _ = attack(port, groups, sent, honest, probe, seconds, context)
        ratio = under.p50 / base.p50
        print(f"  {attack_name:20s} {under.row()}  ({ratio:.2f}x)", flush=True)


def throughput(port: int, clients: int, seconds: float, reuse: bool = True) -> float:
    done, stop_at = [0], time.monotonic() + seconds
    lock = threading.Lock()

    def client() -> None:
        # Each client keeps its connection while the server does, as the API
        # server's webhook client does (unless `reuse` is False).
        caller = Client(port, reuse=reuse)
        while time.monotonic() < stop_at:
            if caller.call("POST", WEBHOOK, REVIEW)[0] == 200:
                with lock:
                    done[0] += 1
        caller.close()

    with ThreadPoolExecutor(clients) as pool:
        for _ in range(clients):
            pool.submit(client)
    return done[0] / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--throughput", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.throughput:
            process, web, _ = start(args.repo, workdir, {}, "t.log")
            try:
                for _ in range(20):
                    request(web, "POST", WEBHOOK, REVIEW)
                rate = throughput(web, args.throughput, args.seconds)
            finally:
                stop(process, workdir, "t.log")
            print(f"webhook calls/s with {args.throughput} clients: {rate:.1f}")
            return 0
        env = {"KSSCHED_EXTENDER_READ_TIMEOUT": "2", "KSSCHED_WEB_READ_TIMEOUT": "2"}
        process, web, extender = start(args.repo, workdir, env, "plain.log")
        try:
            honest = functools.partial(
                request, extender, "POST", PRIORITIZE, PRIORITIZE_BODY
            )
            probe = functools.partial(request, extender, "GET", "/healthz", timeout=3)
            sent = kinds(PRIORITIZE)
            table("extender", extender, ATTACKS, sent, honest, probe, args.seconds)
            honest = functools.partial(request, web, "POST", WEBHOOK, REVIEW)
            probe = functools.partial(request, web, "GET", "/healthz", timeout=3)
            sent = kinds(WEBHOOK)
            table("web", web, ATTACKS, sent, honest, probe, args.seconds)
        finally:
            print("workers restarted:", stop(process, workdir, "plain.log"))
        make_pki(workdir)
        tls = {
            **env,
            "KSSCHED_TLS_CERT_FILE": str(workdir / "server.crt"),
            "KSSCHED_TLS_KEY_FILE": str(workdir / "server.key"),
        }
        process, web, _ = start(args.repo, workdir, tls, "tls.log")
        try:
            import ssl

            context = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
            honest = functools.partial(request, web, "POST", WEBHOOK, REVIEW, context)
            probe = functools.partial(
                request, web, "GET", "/healthz", context=context, timeout=3
            )
            attacks = {**TLS_ATTACKS, **ATTACKS}
            sent = kinds(WEBHOOK)
            table("web TLS", web, attacks, sent, honest, probe, args.seconds, context)
        finally:
            print("workers restarted:", stop(process, workdir, "tls.log"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
