"""Two listeners, as `python -m kssched.serve` runs them: the web listener on the pod
port and the extender listener on loopback, each with its own workers. Slow clients
on either must not hold up kube-scheduler's calls."""

import http.client
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from history.ledger import increment_key_nodes
from tests.helpers import REPO, load_fixture, log_path, run_gunicorn, run_servers

pytestmark = pytest.mark.django_db(transaction=True)

PRIORITIZE = "/scheduler/priorities/pipeline"
FILTER = "/scheduler/predicates/alwaystrue"
# A request line and half a header, then nothing: what a stalled client sends.
PARTIAL = b"POST /scheduler/priorities/pipeline HTTP/1.1\r\nHost: localhost\r\nCont"
HEADERS = {"Content-Type": "application/json", "Host": "localhost"}


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def call(url, method, path, body=None, timeout=10.0, headers=None):
    """(status, body, seconds) of one request on a new connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port_of(url), timeout=timeout)
    started = time.perf_counter()
    try:
        conn.request(
            method,
            path,
            body=body,
            headers={
                "Content-Type": "application/json",
                "Host": "localhost",
                **(headers or {}),
            },
        )
        response = conn.getresponse()
        answer = response.read()
        return response.status, answer, time.perf_counter() - started
    finally:
        conn.close()


def stall(url, count: int, partial: bytes = PARTIAL) -> list[socket.socket]:
    """`count` connections that each sent `partial` and then nothing."""
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port_of(url)), timeout=10)
        sock.sendall(partial)
        held.append(sock)
    return held


def is_closed_by_server(sock: socket.socket, wait: float) -> bool:
    """True when the server closes `sock` (or answers and closes) within `wait` s."""
    sock.settimeout(wait)
    try:
        while sock.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


def samples_of(text: str) -> dict:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(url, name, *, at_least: float = 0, **labels) -> float:
    """A sample scraped from /metrics on `url`.

    Calls are counted just after their reply went out, so a scrape right after a
    reply may come too early: with `at_least`, scrape again for up to 5 s until the
    value gets there (and return whatever it is then).
    """
    deadline = time.monotonic() + 5
    while True:
        status, text, _ = call(url, "GET", "/metrics")
        assert status == 200, text
        key = (name, tuple(sorted(labels.items())))
        found = samples_of(text.decode()).get(key, 0.0)
        if found >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


# --- slow clients ---------------------------------------------------------------------


def test_stalled_clients_on_the_web_listener_do_not_slow_the_extender_listener():
    increment_key_nodes(keys=["pipeline1"], node="worker-1")
    prioritize = load_fixture("prioritize-nodenames.json")
    filter_body = load_fixture("filter-nodenames.json")
    with run_servers(web_workers=3, extender_workers=2) as (web, extender, _):
        # Warm both extender workers up (first request of a worker imports things).
        for _ in range(4):
            assert call(extender, "POST", PRIORITIZE, prioritize)[0] == 200
            assert call(web, "GET", "/healthz")[0] == 200
        held = stall(web, 20)
        try:
            # The web listener's workers are not held either.
            assert call(web, "GET", "/healthz", timeout=1.0)[0] == 200
            latencies = []
            until = time.monotonic() + 6
            while time.monotonic() < until:
                for path, body in ((PRIORITIZE, prioritize), (FILTER, filter_body)):
                    status, answer, seconds = call(extender, "POST", path, body)
                    assert status == 200, answer
                    latencies.append(seconds)
        finally:
            for sock in held:
                sock.close()
    # Normal latency is a few milliseconds; the bounds only leave room for a busy
    # machine. Before the listeners were split, each call waited about 20 s.
    assert len(latencies) > 20
    assert statistics.median(latencies) < 0.5, latencies
    assert max(latencies) < 2.0, latencies


def test_stalled_clients_on_the_extender_listener_are_dropped_after_the_read_timeout():
    prioritize = load_fixture("prioritize-nodenames.json")
    env = {"KSSCHED_EXTENDER_READ_TIMEOUT": "2"}
    with run_servers(env, web_workers=1, extender_workers=2) as (web, extender, _):
        for _ in range(4):
            assert call(extender, "POST", PRIORITIZE, prioritize)[0] == 200
        before = metric(
            web, "kssched_extender_errors_total", verb="unknown", reason="read_timeout"
        )
        # More stalled heads than workers, and a complete head whose body stalls.
        held = stall(extender, 6)
        body_staller = stall(
            extender,
            1,
            b"POST /scheduler/priorities/pipeline HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n{",
        )[0]
        # A trickle: one more byte every 0.5 s never ends the head.
        trickler = stall(extender, 1, b"P")[0]
        started = time.monotonic()
        try:
            latencies = []
            while time.monotonic() - started < 3.5:
                status, answer, seconds = call(extender, "POST", PRIORITIZE, prioritize)
                assert status == 200, answer
                latencies.append(seconds)
                if trickler.fileno() != -1:
                    try:
                        trickler.send(b"O")
                    except OSError:
                        trickler.close()
            # Every stalled connection is closed by the server after the timeout.
            for sock in [*held, body_staller]:
                assert is_closed_by_server(sock, wait=5 - (time.monotonic() - started))
            dropped_after = time.monotonic() - started
        finally:
            for sock in [*held, body_staller, trickler]:
                sock.close()
        after = metric(
            web,
            "kssched_extender_errors_total",
            at_least=before + 7,
            verb="unknown",
            reason="read_timeout",
        )
        # The stalled body's head had arrived: it is counted under its verb.
        body_after = metric(
            web,
            "kssched_extender_errors_total",
            at_least=1,
            verb="priorities/pipeline",
            reason="read_timeout",
        )
        dropped = metric(
            web,
            "kssched_connections_dropped_total",
            at_least=8,
            listener="extender",
            reason="read_timeout",
        )
    # Neither a stalled head nor a stalled body holds a worker (only a greenlet), so
    # no call waits behind them.
    assert max(latencies) < 1.0, latencies
    assert statistics.median(latencies) < 0.1, latencies
    assert dropped_after < 5
    assert after - before >= 7  # six stalled heads and the trickle
    assert body_after >= 1
    assert dropped >= 8


# --- what each listener serves --------------------------------------------------------


def test_the_extender_listener_serves_the_scheduler_routes_only():
    body = load_fixture("prioritize-nodenames.json")
    with run_servers(web_workers=1, extender_workers=1) as (web, extender, _):
        assert call(extender, "POST", PRIORITIZE, body)[0] == 200
        assert call(extender, "GET", "/healthz")[:2] == (200, b"ok")
        for path in ("/admin/", "/metrics", "/api/keys/", "/readyz"):
            status, answer, _ = call(extender, "GET", path)
            assert status == 404, (path, answer)
            assert "web listener" in orjson.loads(answer)["Error"]
        # The web listener serves the rest, and still answers the extender routes
        # to loopback callers (port-forward debugging).
        assert call(web, "GET", "/admin/")[0] == 302
        assert call(web, "GET", "/readyz")[0] == 200
        assert call(web, "POST", PRIORITIZE, body)[0] == 200


def test_the_extender_listener_must_be_on_loopback():
    env = {"KSSCHED_EXTENDER_BIND": "0.0.0.0:0"}
    with pytest.raises(RuntimeError, match="is not valid: a loopback address"):
        with run_gunicorn({**env, "KSSCHED_LISTENER": "extender"}, workers=1):
            pass


# --- gunicorn's own answers on the extender listener ----------------------------------


def raw_exchange(url, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_gunicorn_errors_on_the_extender_listener_are_short_json_and_counted():
    with run_servers(web_workers=1, extender_workers=1) as (web, extender, _):
        cases = [
            (b"NOT A REQUEST\r\n\r\n", 400, "bad_request"),
            (
                b"GET /" + b"x" * 9000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
                414,
                "uri_too_long",
            ),
            (
                b"POST /scheduler/priorities/pipeline HTTP/1.1\r\nHost: localhost\r\n"
                + b"".join(b"X-%d: y\r\n" % i for i in range(120))
                + b"\r\n",
                431,
                "header_fields_too_large",
            ),
        ]
        for data, status, reason in cases:
            answer = raw_exchange(extender, data)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 %d " % status), answer[:200]
            assert b"Content-Type: application/json" in head
            assert len(body) < 300
            assert set(orjson.loads(body)) == {"Error"}
            assert b"<html" not in answer
            count = metric(
                web, "kssched_extender_errors_total", verb="unknown", reason=reason
            )
            assert count == 1, reason


def test_a_stalled_body_on_the_extender_listener_is_answered_408_in_json():
    """A body that stops half-way is answered `408` with a JSON body within the
    read timeout, and counted as an extender error and a dropped connection; the
    worker goes on serving."""
    env = {"KSSCHED_EXTENDER_READ_TIMEOUT": "1"}
    with run_servers(env, web_workers=1, extender_workers=1) as (web, extender, _):
        started = time.monotonic()
        answer = raw_exchange(
            extender,
            b"POST /scheduler/priorities/pipeline HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n{",
        )
        assert time.monotonic() - started < 10
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:300]
        assert b"Content-Type: application/json" in head
        assert set(orjson.loads(body)) == {"Error"}
        count = metric(
            web,
            "kssched_extender_errors_total",
            verb="priorities/pipeline",
            reason="read_timeout",
        )
        assert count == 1
        dropped = metric(
            web,
            "kssched_connections_dropped_total",
            listener="extender",
            reason="read_timeout",
        )
        assert dropped == 1
        assert call(extender, "GET", "/healthz")[0] == 200


# --- kept-alive connections -----------------------------------------------------------


def test_both_listeners_keep_a_connection_for_the_next_call_and_a_stop_closes_it():
    """kube-scheduler's and the API server's Go clients reuse a connection while the
    server keeps it: each listener answers call after call on one socket. A stopping
    server closes those idle connections at once rather than waiting its graceful
    timeout for them (30 s here, with the keep-alive at its 100 s default)."""
    body = load_fixture("prioritize-nodenames.json")
    env = {"KSSCHED_GRACEFUL_TIMEOUT": "30"}
    with run_servers(env, web_workers=1, extender_workers=1) as (web, extender, serve):
        kept = []
        for url in (extender, web):
            conn = http.client.HTTPConnection("127.0.0.1", port_of(url), timeout=10)
            for number in range(3):
                conn.request("POST", PRIORITIZE, body, HEADERS)
                response = conn.getresponse()
                assert response.status == 200, response.read()
                assert response.getheader("Connection") == "keep-alive"
                response.read()
                if number == 0:
                    sock = conn.sock
                assert conn.sock is sock  # the same connection throughout
            kept.append(sock)
        started = time.monotonic()
        serve.terminate()
        serve.wait(timeout=60)
        assert time.monotonic() - started < 15
        for sock in kept:
            assert is_closed_by_server(sock, 1)


def test_an_answer_that_fails_to_close_is_logged_and_the_worker_serves_on():
    """The application greenlet closes each answer after it is sent; an answer whose
    close raises is logged, and the same greenlet (one per worker here) runs the
    next requests. Were it to end, every later request would wait forever."""
    with run_gunicorn(workers=1, app="tests.wsgi_close_fails") as (url, _process):
        for _ in range(3):
            status, body, _seconds = call(url, "GET", "/", timeout=5)
            assert (status, body) == (200, b"answered")
    # Read once the server has stopped: the last close runs after its answer is sent.
    log = log_path(f"gunicorn-{port_of(url)}").read_text()
    assert log.count("Error closing an answer") == 3, log
    assert "this answer cannot be closed" in log
    assert log.count("Booting worker") == 1, log


def test_a_kept_connection_waits_keepalive_then_reads_a_body_within_the_timeout():
    """After an answer the connection waits KSSCHED_KEEPALIVE seconds for the next
    request, then is closed; a next request whose body stalls is answered `408`
    within the read timeout, like a first one."""
    env = {"KSSCHED_KEEPALIVE": "1", "KSSCHED_EXTENDER_READ_TIMEOUT": "1"}
    healthz = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    with run_servers(env, web_workers=1, extender_workers=1) as (web, extender, _):
        for url in (extender, web):
            sock = socket.create_connection(("127.0.0.1", port_of(url)), timeout=10)
            sock.sendall(healthz)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            assert not is_closed_by_server(sock, 0.3)
            assert is_closed_by_server(sock, 5)
            sock.close()
        started = time.monotonic()
        answer = raw_exchange(
            extender,
            healthz + b"POST /scheduler/priorities/pipeline HTTP/1.1\r\n"
            b"Host: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000\r\n\r\n{",
        )
        assert time.monotonic() - started < 10
        first, _, second = answer.partition(b"HTTP/1.1 408 ")
        assert first.startswith(b"HTTP/1.1 200 "), answer[:300]
        assert b"Content-Type: application/json" in second, answer[:600]


def test_keepalive_0_answers_one_request_per_connection():
    body = load_fixture("prioritize-nodenames.json")
    with run_servers({"KSSCHED_KEEPALIVE": "0"}, 1, 1) as (web, extender, _):
        for url in (extender, web):
            conn = http.client.HTTPConnection("127.0.0.1", port_of(url), timeout=10)
            conn.request("POST", PRIORITIZE, body, HEADERS)
            response = conn.getresponse()
            assert response.status == 200
            assert response.getheader("Connection") == "close"
            conn.close()


# --- metrics and logs, however the server is started ----------------------------------


def spread_over_workers(url, path, body, rounds=25) -> int:
    """Send `rounds` x 8 concurrent calls, so that every worker answers some;
    return how many were sent."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(rounds):
            statuses = list(
                pool.map(lambda _: call(url, "POST", path, body)[0], range(8))
            )
            assert statuses == [200] * 8
    return rounds * 8


def test_metrics_add_up_both_listeners_without_a_multiprocess_directory(tmp_path):
    body = load_fixture("prioritize-nodenames.json")
    with run_servers(web_workers=2, extender_workers=2) as (web, extender, _):
        sent = spread_over_workers(extender, PRIORITIZE, body)
        sent += spread_over_workers(web, PRIORITIZE, body, rounds=5)
        for _ in range(4):
            count = metric(
                web,
                "kssched_extender_request_seconds_count",
                at_least=sent,
                verb="priorities/pipeline",
            )
            assert count == sent


def test_a_gunicorn_started_alone_adds_up_its_workers_too():
    body = load_fixture("prioritize-nodenames.json")
    with run_gunicorn(workers=2) as (url, _):
        sent = spread_over_workers(url, PRIORITIZE, body)
        for _ in range(4):
            count = metric(
                url,
                "kssched_extender_request_seconds_count",
                at_least=sent,
                verb="priorities/pipeline",
            )
            assert count == sent


ACCESS_LINE = re.compile(r'"GET /healthz HTTP/1\.1" 200')


@pytest.mark.parametrize(
    ("setting", "logged"), [(None, False), ("0", False), ("1", True)]
)
def test_the_access_log_is_off_unless_asked_for(setting, logged):
    env = {} if setting is None else {"KSSCHED_ACCESS_LOG": setting}
    with run_gunicorn(env, workers=1) as (url, process):
        for _ in range(3):
            assert call(url, "GET", "/healthz")[0] == 200
    text = log_path(f"gunicorn-{port_of(url)}").read_text()
    assert bool(ACCESS_LINE.search(text)) is logged, text[-2000:]


# --- liveness -------------------------------------------------------------------------


def run_probe(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kssched.probe"],
        cwd=REPO,
        env={"PATH": os.environ.get("PATH", ""), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_liveness_probe_checks_the_extender_listener_through_a_web_stall():
    with run_servers(web_workers=1, extender_workers=1) as (web, extender, _):
        bind = extender.removeprefix("http://")
        assert call(web, "GET", "/healthz")[0] == 200
        held = stall(web, 5)
        try:
            # The web listener's workers are not held by the stall either.
            assert call(web, "GET", "/healthz", timeout=1.0)[0] == 200
            result = run_probe({"KSSCHED_EXTENDER_BIND": bind})
            assert result.returncode == 0, result.stderr
        finally:
            for sock in held:
                sock.close()
    result = run_probe({"KSSCHED_EXTENDER_BIND": bind})
    assert result.returncode == 1
    assert "/healthz" in result.stderr
