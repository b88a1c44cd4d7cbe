"""Slow clients on either listener, against the real gunicorn: clients that connect
and send nothing, half a head, half a body, or no TLS handshake must not delay a
webhook review, a kube-scheduler call or a probe."""

import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from history.ledger import increment_key_nodes
from tests.helpers import load_fixture, log_path, run_gunicorn, run_servers
from tests.test_listeners import (
    PARTIAL,
    PRIORITIZE,
    call,
    metric,
    port_of,
    run_probe,
    samples_of,
    stall,
)
from tests.test_security import call as tls_call
from tests.test_security import (  # noqa: F401 - pki is a fixture
    client_context,
    pki,
    tls_env,
)
from tests.test_webhook import new_pod, review

pytestmark = pytest.mark.django_db(transaction=True)

# The API server's budget is the webhook's timeoutSeconds (2); this leaves it room,
# and a busy 2-core machine too (a stalled worker answers nothing at all).
WEBHOOK_BUDGET = 1.5
# The kubelet's probes in deploy/ time out after 3 s.
PROBE_TIMEOUT = 3.0


def warm_up(url, path, body, workers: int) -> None:
    """Calls at once, so every worker has answered one (a worker's first request
    loads what it needs, which takes longer than the budget on a busy machine)."""
    with ThreadPoolExecutor(workers * 2) as pool:
        for _ in range(4):
            calls = [
                pool.submit(call, url, "POST", path, body) for _ in range(workers * 2)
            ]
            assert all(done.result()[0] == 200 for done in calls)


class Stallers:
    """`count` clients that each send `data` and then nothing, reconnecting as soon
    as the server closes them (as a persistent attacker would)."""

    def __init__(self, port: int, count: int, data: bytes):
        self.port, self.data = port, data
        self.stop = threading.Event()
        self.connections = 0
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
            self.connections += 1
            try:
                if self.data:
                    sock.sendall(self.data)
                sock.settimeout(0.1)
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

    def close(self):
        self.stop.set()
        for thread in self.threads:
            thread.join()


@pytest.mark.parametrize("count", [3, 20, 100])
def test_idle_and_slow_header_clients_on_the_web_port_delay_no_review_nor_probe(
    count,
):
    """The webhook overlay's liveness probe is an httpGet on the web port, which
    the NetworkPolicy opens to anyone: `count` idle connections and `count` that
    sent half a head must delay neither the reviews nor the probe."""
    increment_key_nodes(keys=["ci", "java", "app"], node="n1")
    body = orjson.dumps(review(new_pod()))
    with run_gunicorn(workers=3) as (url, _process):
        warm_up(url, "/webhook/mutate", body, 3)
        held = stall(url, count, b"") + stall(url, count, PARTIAL)
        try:
            time.sleep(0.2)
            for _ in range(8):
                status, answer, seconds = call(url, "POST", "/webhook/mutate", body)
                assert status == 200, answer
                assert seconds < WEBHOOK_BUDGET, seconds
                status, answer, _ = call(url, "GET", "/healthz", timeout=PROBE_TIMEOUT)
                assert (status, answer) == (200, b"ok")
        finally:
            for sock in held:
                sock.close()


def test_idle_clients_on_the_tls_web_port_delay_no_review_nor_probe(pki):  # noqa: F811
    """The webhook overlay serves TLS on the web port: connections that never start
    the handshake, or stop half-way through it, hold no worker."""
    directory, _address = pki
    body = orjson.dumps(review(new_pod()))
    context = client_context(directory)
    with run_gunicorn(tls_env(directory, with_ca=False), workers=3) as (url, _):
        port = port_of(url)
        assert tls_call("127.0.0.1", port, "GET", "/readyz", context=context)[0] == 200
        # Every worker answers its first, slower request before the clock starts.
        with ThreadPoolExecutor(6) as pool:
            for _ in range(4):
                warm = [
                    pool.submit(
                        tls_call,
                        "127.0.0.1",
                        port,
                        "POST",
                        "/webhook/mutate",
                        body,
                        context,
                    )
                    for _ in range(6)
                ]
                assert all(done.result()[0] == 200 for done in warm)
        # A ClientHello's first bytes (a TLS record header), then nothing.
        held = stall(url, 20, b"") + stall(url, 20, b"\x16\x03\x01\x02\x00\x01")
        try:
            for _ in range(8):
                started = time.perf_counter()
                status, answer = tls_call(
                    "127.0.0.1", port, "POST", "/webhook/mutate", body, context
                )
                assert status == 200, answer
                assert time.perf_counter() - started < WEBHOOK_BUDGET
                started = time.perf_counter()
                status, answer = tls_call(
                    "127.0.0.1", port, "GET", "/healthz", context=context
                )
                assert (status, answer) == (200, b"ok")
                assert time.perf_counter() - started < PROBE_TIMEOUT
        finally:
            for sock in held:
                sock.close()


def test_stalled_bodies_on_the_extender_listener_delay_no_call_and_the_probe_passes():
    """Clients that send a whole head and half a body, reconnecting as soon as they
    are dropped, hold no worker: the body is read within the deadline too."""
    prioritize = load_fixture("prioritize-nodenames.json")
    head = (
        f"POST {PRIORITIZE} HTTP/1.1\r\nHost: localhost\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(prioritize)}\r\n\r\n"
    ).encode()
    env = {"KSSCHED_EXTENDER_READ_TIMEOUT": "1"}
    with run_servers(env, web_workers=1, extender_workers=2) as (web, extender, _):
        for _ in range(4):
            assert call(extender, "POST", PRIORITIZE, prioritize)[0] == 200
        stallers = Stallers(port_of(extender), 10, head + prioritize[:20])
        try:
            time.sleep(0.3)
            latencies = []
            until = time.monotonic() + 3
            while time.monotonic() < until:
                status, answer, seconds = call(extender, "POST", PRIORITIZE, prioritize)
                assert status == 200, answer
                latencies.append(seconds)
            bind = extender.removeprefix("http://")
            for _ in range(3):
                result = run_probe({"KSSCHED_EXTENDER_BIND": bind})
                assert result.returncode == 0, result.stderr
        finally:
            stallers.close()
        # The stallers were dropped after the read timeout, and reconnected.
        assert stallers.connections >= 20
        dropped = metric(
            web,
            "kssched_connections_dropped_total",
            at_least=10,
            listener="extender",
            reason="read_timeout",
        )
        assert dropped >= 10
    # Before, every call waited behind the stalled bodies: 4 s with five of them.
    assert statistics.median(latencies) < 0.05, latencies
    assert max(latencies) < 2.0, latencies  # a loaded machine; stalled: 5 s+


def test_clients_without_a_certificate_cost_no_more_than_a_stalled_client(
    pki,  # noqa: F811
):
    """With client certificates required, clients that never finish (or never
    start) the handshake neither delay the calls nor get workers killed."""
    directory, _address = pki
    prioritize = load_fixture("prioritize-nodenames.json")
    env = {**tls_env(directory, with_ca=True), "KSSCHED_EXTENDER_READ_TIMEOUT": "1"}
    verified = client_context(directory, "client")
    with run_servers(env, web_workers=1, extender_workers=2) as (web, extender, _):
        port = port_of(extender)
        for _ in range(4):
            assert tls_call("127.0.0.1", port, "POST", PRIORITIZE, prioritize, verified)
        stallers = Stallers(port, 5, b"")
        try:
            time.sleep(0.3)
            latencies = []
            until = time.monotonic() + 3
            while time.monotonic() < until:
                started = time.perf_counter()
                status, answer = tls_call(
                    "127.0.0.1", port, "POST", PRIORITIZE, prioritize, verified
                )
                assert status == 200, answer
                latencies.append(time.perf_counter() - started)
            # A client without a certificate fails the handshake at once.
            for _ in range(3):
                with pytest.raises(OSError):
                    tls_call(
                        "127.0.0.1",
                        port,
                        "POST",
                        PRIORITIZE,
                        prioritize,
                        client_context(directory),
                    )
        finally:
            stallers.close()
        assert stallers.connections >= 5
        # The web listener serves TLS with client certificates too.
        status, text = tls_call(
            "127.0.0.1", port_of(web), "GET", "/metrics", context=verified
        )
        assert status == 200
        key = (
            "kssched_connections_dropped_total",
            (("listener", "extender"), ("reason", "tls_handshake")),
        )
        assert samples_of(text.decode())[key] >= 3
    log = log_path(f"serve-{port_of(web)}").read_text()
    assert "Traceback" not in log
    assert "WORKER TIMEOUT" not in log
    # Before, two idle clients made the median call 1977 ms.
    assert statistics.median(latencies) < 0.05, latencies
    assert max(latencies) < 2.0, latencies  # a loaded machine; stalled: 5 s+


def test_a_client_that_waits_for_100_continue_gets_it():
    """curl sends `Expect: 100-continue` before a large body and waits for the
    answer: the worker must not wait for a body that comes only after it."""
    prioritize = load_fixture("prioritize-nodenames.json")
    with run_servers(web_workers=1, extender_workers=1) as (_web, extender, _):
        with socket.create_connection(("127.0.0.1", port_of(extender)), 5) as sock:
            sock.sendall(
                f"POST {PRIORITIZE} HTTP/1.1\r\nHost: localhost\r\n"
                "Content-Type: application/json\r\nExpect: 100-continue\r\n"
                f"Content-Length: {len(prioritize)}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
            sock.sendall(prioritize)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_large_and_chunked_bodies_are_served():
    """A body of more than 1 MiB, sized or chunked, is read whole before the
    application runs."""
    names = [f"node-{i:05d}-" + "x" * 230 for i in range(2**20 // 230)]
    body = orjson.dumps(
        {"Pod": {"metadata": {"labels": {"ks-pipeline": "a"}}}, "NodeNames": names}
    )
    assert len(body) > 2**20
    with run_servers(web_workers=1, extender_workers=1) as (web, extender, _):
        status, answer, _ = call(extender, "POST", PRIORITIZE, body)
        assert status == 200, log_path(f"serve-{port_of(web)}").read_text()[-3000:]
        assert len(orjson.loads(answer)) == len(names)
        # An iterable body without a length: http.client sends it chunked.
        status, answer, _ = call(
            extender, "POST", PRIORITIZE, iter([body[:1000], body[1000:]])
        )
        assert status == 200, answer[:200]
        assert len(orjson.loads(answer)) == len(names)
