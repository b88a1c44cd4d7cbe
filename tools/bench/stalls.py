"""Calls and probes while stalled clients hold connections, on either listener.

    python -m tools.bench.stalls web --held 3 [--kind idle|head] [--tls]
    python -m tools.bench.stalls bodies --held 5
    python -m tools.bench.stalls tls --held 2
    python -m tools.bench.stalls throughput --clients 8

Starts ks-scheduler as deployed (`python -m kssched.serve`) on free loopback ports.

- `web`: `--held` connections to the web listener that send nothing (`idle`) or half
  a request head (`head`); meanwhile webhook reviews (`POST /webhook/mutate`) one at a
  time, and a `GET /healthz` as the kubelet's probe sends it (3 s timeout) each
  second. `--tls` serves the web listener over TLS, as the webhook overlay does.
- `bodies`: `--held` clients that send a prioritize head and half its body to the
  extender listener, and reconnect as soon as they are closed; meanwhile prioritize
  calls one at a time, and `python -m kssched.probe` each second.
- `tls`: the extender listener with client certificates required; `--held` clients
  connect and send nothing (no handshake, no certificate), reconnecting when closed;
  meanwhile prioritize calls with a client certificate (no probe: kssched.probe
  speaks plain HTTP).
- `throughput`: prioritize calls per second with `--clients` clients at once.

Prints p50/p99/max of the calls, how many failed, and how many probes passed.
`GUNICORN_CMD_ARGS` is passed on, to measure another worker class side by side.
"""

import argparse
import http.client
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

from tests.servers import free_port, wait_for_port

REPO = Path(__file__).resolve().parent.parent.parent
PRIORITIZE = "/scheduler/priorities/pipeline"
HEAD_PART = b"POST /webhook/mutate HTTP/1.1\r\nHost: localhost\r\nCont"
REVIEW = orjson.dumps(
    {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ci",
            "operation": "CREATE",
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "build-1", "labels": {"ks-pipeline": "ci-java"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }
)


def make_pki(directory: Path) -> None:
    from tests.test_security import make_ca, make_certificate

    make_ca(directory, "ca")
    make_certificate(
        directory,
        "server",
        issuer="ca",
        extensions=[
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "extendedKeyUsage=serverAuth",
        ],
    )
    make_certificate(
        directory, "client", issuer="ca", extensions=["extendedKeyUsage=clientAuth"]
    )


def start(workdir: Path, extra: dict[str, str]):
    web, extender = free_port(), free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "SECRET_KEY": "bench-secret-key-not-for-production-0123456789",
        "DATA_PATH": str(workdir / "scheduler.db"),
        "KSSCHED_BIND": f"127.0.0.1:{web}",
        "KSSCHED_EXTENDER_BIND": f"127.0.0.1:{extender}",
        "LOG_LEVEL": "WARNING",
        **extra,
    }
    # Another worker class side by side, e.g. "--worker-class gthread --threads 4".
    if os.environ.get("GUNICORN_CMD_ARGS"):
        env["GUNICORN_CMD_ARGS"] = os.environ["GUNICORN_CMD_ARGS"]
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True
    )
    log = open(workdir / "server.log", "wb")  # noqa: SIM115 - the child keeps it
    process = subprocess.Popen(
        [sys.executable, "-m", "kssched.serve"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=log,
    )
    for port in (web, extender):
        wait_for_port(port, process)
    return process, web, extender, env


def timed(port, method, path, body, context=None, timeout=10.0) -> float | None:
    """Seconds one call took on a new connection, or None if it failed."""
    started = time.perf_counter()
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", port, timeout=timeout, context=context
        )
    try:
        conn.request(
            method,
            path,
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


class Holders:
    """`count` threads, each keeping one stalled connection open (reconnecting when
    the server closes it, if `reconnect`)."""

    def __init__(self, port: int, count: int, send: bytes, reconnect: bool):
        self.port, self.send, self.reconnect = port, send, reconnect
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.hold) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def hold(self):
        while not self.stop.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                time.sleep(0.05)
                continue
            try:
                if self.send:
                    sock.sendall(self.send)
                sock.settimeout(0.2)
                while not self.stop.is_set():
                    try:
                        if not sock.recv(65536):
                            break
                    except TimeoutError:
                        continue
            except OSError:
                pass
            finally:
                sock.close()
            if not self.reconnect:
                self.stop.wait()

    def close(self):
        self.stop.set()
        for thread in self.threads:
            thread.join()


def summary(name: str, values: list[float], failed: int) -> str:
    if not values:
        return f"{name}: n=0 failed={failed}"
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return (
        f"{name}: n={len(values)} p50={statistics.median(values) * 1000:.2f} ms "
        f"p99={p99 * 1000:.2f} ms max={values[-1] * 1000:.2f} ms failed={failed}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("web", "bodies", "tls", "throughput"))
    parser.add_argument("--held", type=int, default=3)
    parser.add_argument("--kind", choices=("idle", "head"), default="idle")
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--clients", type=int, default=8)
    options = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="kssched-stalls-"))
    extra: dict[str, str] = {}
    context = None
    if options.tls or options.mode == "tls":
        make_pki(workdir)
        extra = {
            "KSSCHED_TLS_CERT_FILE": str(workdir / "server.crt"),
            "KSSCHED_TLS_KEY_FILE": str(workdir / "server.key"),
        }
        context = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
        if options.mode == "tls":
            extra["KSSCHED_TLS_CA_FILE"] = str(workdir / "ca.crt")
            context.load_cert_chain(
                str(workdir / "client.crt"), str(workdir / "client.key")
            )
    prioritize = (
        REPO / "tests" / "fixtures" / "prioritize-nodenames.json"
    ).read_bytes()
    process, web, extender, env = start(workdir, extra)
    try:
        if options.mode == "web":
            port, path, body = web, "/webhook/mutate", REVIEW
        else:
            port, path, body = extender, PRIORITIZE, prioritize
        for _ in range(10):
            timed(port, "POST", path, body, context)
            timed(web, "GET", "/healthz", None, context if port == web else None)
        if options.mode == "throughput":
            return throughput(extender, prioritize, options)
        calm = [timed(port, "POST", path, body, context) for _ in range(100)]
        print(summary("before", [v for v in calm if v is not None], calm.count(None)))
        if options.mode == "web":
            send = HEAD_PART if options.kind == "head" else b""
            holders = Holders(web, options.held, send, reconnect=False)
        elif options.mode == "bodies":
            head = (
                f"POST {PRIORITIZE} HTTP/1.1\r\nHost: localhost\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(prioritize)}\r\n\r\n"
            ).encode()
            send = head + prioritize[: len(prioritize) // 2]
            holders = Holders(extender, options.held, send, reconnect=True)
        else:
            holders = Holders(extender, options.held, b"", reconnect=True)
        time.sleep(0.5)
        values, failed, probes = [], 0, []
        until = time.monotonic() + options.seconds
        next_probe = time.monotonic()
        try:
            while time.monotonic() < until:
                seconds = timed(port, "POST", path, body, context, timeout=10)
                if seconds is None:
                    failed += 1
                else:
                    values.append(seconds)
                if options.mode != "tls" and time.monotonic() >= next_probe:
                    next_probe = time.monotonic() + 1
                    probes.append(probe(options, web, env, context))
        finally:
            holders.close()
        what = f"{options.held} held ({options.mode}, {options.kind})"
        print(summary(what, values, failed))
        print(f"probes passed: {sum(probes)} of {len(probes)}")
        if options.mode == "web":
            within = sum(1 for v in values if v <= 0.5)
            print(f"calls within 0.5 s: {within} of {len(values) + failed}")
    finally:
        process.terminate()
        process.wait(timeout=60)
    log = (workdir / "server.log").read_text(errors="replace")
    print(
        f"log: {log.count('Traceback')} tracebacks, {log.count('WORKER TIMEOUT')} "
        f"worker timeouts, {log.count('WARNING')} warnings"
    )
    return 0


def probe(options, web: int, env: dict[str, str], context) -> bool:
    """The liveness probe of the overlay this mode stands for."""
    if options.mode == "web":
        # The webhook overlay: the kubelet's httpGet on the web port, 3 s timeout.
        return timed(web, "GET", "/healthz", None, context, timeout=3) is not None
    # The base overlay: an exec of kssched.probe.
    result = subprocess.run(
        [sys.executable, "-m", "kssched.probe"],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=10,
    )
    return result.returncode == 0


def throughput(port: int, body: bytes, options) -> int:
    for clients in (1, options.clients):
        rate = calls_per_second(port, body, clients, options.seconds)
        print(f"{clients} clients: {rate:.0f} calls/s")
    return 0


def calls_per_second(port: int, body: bytes, clients: int, seconds: float) -> float:
    count = [0]
    lock = threading.Lock()
    until = time.monotonic() + seconds

    def work():
        while time.monotonic() < until:
            if timed(port, "POST", PRIORITIZE, body) is not None:
                with lock:
                    count[0] += 1

    threads = [threading.Thread(target=work) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return count[0] / seconds


if __name__ == "__main__":
    sys.exit(main())
