"""Slow-client attacks on a running listener, with honest calls and probes meanwhile.

Used by tests/test_attacks.py (in `make test`) and tools/bench/attacks.py (before
and after tables). Each attacker connects, sends the bytes of its kind, then nothing,
and reconnects as soon as the server closes it, as a persistent attacker would.
"""

import http.client
import socket
import ssl
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

PRIORITIZE = "/scheduler/priorities/pipeline"
WEBHOOK = "/webhook/mutate"


def kinds(path: str) -> dict[str, bytes]:
    """What each kind of attacker sends to `path` before it stalls."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    )
    kept = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    return {
        "idle": b"",
        "half_head": head.encode()[:-20],
        "chunked_head": (head + "Transfer-Encoding: chunked\r\n\r\n").encode(),
        "sized_body": (head + "Content-Length: 4000\r\n\r\n" + '{"Pod": ').encode(),
        "chunked_body": (
            head + "Transfer-Encoding: chunked\r\n\r\n" + "fa0\r\n" + '{"Pod": '
        ).encode(),
        # One whole request, answered; then the connection kept and nothing more, or
        # half of a second request's sized body.
        "kept_idle": kept,
        "kept_body": kept + (head + "Content-Length: 4000\r\n\r\n{").encode(),
    }


# The attacks: (kind, connections) per group of attackers.
ATTACKS: dict[str, list[tuple[str, int]]] = {
    "idle 3": [("idle", 3)],
    "idle 20": [("idle", 20)],
    "idle 100": [("idle", 100)],
    "half heads 20": [("half_head", 20)],
    "chunked heads 20": [("chunked_head", 20)],
    "sized bodies 20": [("sized_body", 20)],
    "chunked bodies 20": [("chunked_body", 20)],
    "kept-alive idle 20": [("kept_idle", 20)],
    "kept-alive bodies 20": [("kept_body", 20)],
    "mixed 4x10": [
        ("chunked_head", 10),
        ("sized_body", 10),
        ("idle", 10),
        ("chunked_body", 10),
    ],
}
# On a TLS port: no handshake at all, and a ClientHello's first bytes.
TLS_ATTACKS: dict[str, list[tuple[str, int]]] = {
    "no handshake 20": [("idle", 20)],
    "half ClientHello 20": [("client_hello", 20)],
}
CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01"


class Attackers:
    """Attackers of `kinds` on 127.0.0.1:`port`; with `context`, each finishes the
    TLS handshake before it sends its bytes and stalls (except `raw` kinds)."""

    def __init__(
        self,
        port: int,
        groups: list[tuple[str, int]],
        sent: dict[str, bytes],
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.port, self.context = port, context
        self.stop = threading.Event()
        self.connections = 0
        self.threads = [
            threading.Thread(target=self.hold, args=(kind, sent.get(kind, b"")))
            for kind, count in groups
            for _ in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def hold(self, kind: str, data: bytes) -> None:
        while not self.stop.is_set():
            try:
                sock: socket.socket = socket.create_connection(
                    ("127.0.0.1", self.port), timeout=5
                )
            except OSError:
                time.sleep(0.05)
                continue
            self.connections += 1
            try:
                if kind == "client_hello":
                    sock.sendall(CLIENT_HELLO)
                elif self.context is not None and kind != "idle":
                    sock = self.context.wrap_socket(sock, server_hostname="localhost")
                if data and kind != "client_hello":
                    sock.sendall(data)
                sock.settimeout(0.1)
                while not self.stop.is_set():
                    try:
                        if not sock.recv(65536):
                            break
                    except TimeoutError:
                        continue
            except OSError:
                time.sleep(0.05)
            finally:
                sock.close()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    context: ssl.SSLContext | None = None,
    timeout: float = 5.0,
) -> tuple[int, float]:
    """(status, seconds) of one call on a new connection; status 0 when it failed."""
    return Client(port, context, timeout, reuse=False).call(method, path, body)


class Client:
    """Calls on one connection, reused while the server keeps it open and opened
    again once it closes it, as Go's http.Transport (kube-scheduler, the API server)
    uses one; with `reuse=False`, each call on a new connection."""

    def __init__(
        self,
        port: int,
        context: ssl.SSLContext | None = None,
        timeout: float = 5.0,
        reuse: bool = True,
    ) -> None:
        self.reuse = reuse
        if context is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        else:
            self.conn = http.client.HTTPSConnection(
                "127.0.0.1", port, timeout=timeout, context=context
            )

    def call(
        self, method: str, path: str, body: bytes | None = None
    ) -> tuple[int, float]:
        """(status, seconds) of one call; status 0 when it failed."""
        started = time.perf_counter()
        try:
            self.conn.request(method, path, body, {"Content-Type": "application/json"})
            response = self.conn.getresponse()
            response.read()
            if not self.reuse:
                self.conn.close()
            return response.status, time.perf_counter() - started
        except (OSError, http.client.HTTPException):
            self.conn.close()
            return 0, time.perf_counter() - started

    def close(self) -> None:
        self.conn.close()


@dataclass
class Result:
    calls: int
    failed: int
    p50: float
    probes: int
    probes_ok: int

    def row(self) -> str:
        return (
            f"{self.calls:5d} calls, {self.failed} failed,"
            f" p50 {self.p50 * 1000:7.2f} ms, probes {self.probes_ok}/{self.probes}"
        )


def measure(
    honest: Callable[[], tuple[int, float]],
    probe: Callable[[], tuple[int, float]],
    seconds: float,
) -> Result:
    """Honest calls one at a time for `seconds`, a probe every 0.5 s beside them."""
    probes: list[int] = []
    stop = threading.Event()

    def probing() -> None:
        while not stop.wait(0.5):
            probes.append(probe()[0])

    prober = threading.Thread(target=probing)
    prober.start()
    latencies, failed = [], 0
    until = time.monotonic() + seconds
    try:
        while time.monotonic() < until:
            status, took = honest()
            if status == 200:
                latencies.append(took)
            else:
                failed += 1
    finally:
        stop.set()
        prober.join()
    return Result(
        calls=len(latencies) + failed,
        failed=failed,
        p50=statistics.median(latencies) if latencies else float("inf"),
        probes=len(probes),
        probes_ok=sum(status == 200 for status in probes),
    )


def attack(
    port: int,
    groups: list[tuple[str, int]],
    sent: dict[str, bytes],
    honest: Callable[[], tuple[int, float]],
    probe: Callable[[], tuple[int, float]],
    seconds: float,
    context: ssl.SSLContext | None = None,
) -> tuple[Result, int]:
    """The honest calls' result under `groups` of attackers, and how many
    connections the attackers made (they reconnect when closed)."""
    attackers = Attackers(port, groups, sent, context)
    try:
        time.sleep(0.3)
        result = measure(honest, probe, seconds)
    finally:
        attackers.close()
    return result, attackers.connections
