"""Input that could exhaust a worker: label values no pod can carry, chunked bodies,
bodies whose parsed form would not fit the worker's memory."""

import http.client
import select
import socket
import time

import orjson
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from extender.parsers import estimate_decoded_bytes
from history.labels import is_valid_label_value
from history.ledger import increment_key_nodes
from tests.helpers import load_fixture, run_gunicorn

PRIORITIZE = "/scheduler/priorities/pipeline"
FILTER = "/scheduler/predicates/alwaystrue"
EXPLAIN = "/scheduler/explain"


def labelled_body(label: str) -> bytes:
    return orjson.dumps(
        {
            "Pod": {"metadata": {"name": "p", "labels": {"ks-pipeline": label}}},
            "Nodes": None,
            "NodeNames": ["node1", "node2"],
        }
    )


# --- label values ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("", True),
        ("a", True),
        ("jenkins-java-maven-myapp", True),
        ("A.b_c-9", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("-a", False),
        ("a-", False),
        ("a b", False),
        ("a/b", False),
        ("é", False),
        ("a\n", False),
    ],
)
def test_label_values_follow_the_kubernetes_rule(value, valid):
    assert is_valid_label_value(value) is valid


@pytest.mark.django_db
@pytest.mark.parametrize("segments", [10_000, 100_000, 1_000_000])
@pytest.mark.parametrize("url", [PRIORITIZE, EXPLAIN])
def test_a_label_with_many_segments_is_refused_quickly(segments, url):
    increment_key_nodes(keys=["s"], node="node1")
    body = labelled_body("-".join(["s"] * segments))
    started = time.perf_counter()
    with CaptureQueriesContext(connection) as queries:
        response = APIClient().generic(
            "POST", url, body, content_type="application/json"
        )
    elapsed = time.perf_counter() - started
    assert response.status_code == 400, response.content[:200]
    error = orjson.loads(response.content)["Error"]
    assert "not a valid Kubernetes label value" in error
    assert f"{2 * segments - 1} characters" in error
    # The message quotes the value shortened, never the whole of it.
    assert len(error) < 400
    # No history is read for it, and the answer does not grow with the value: the
    # parse of a 2 MB body is all that is left (generous bound for busy machines).
    # The cache's housekeeping after a reply (a prune or a horizon update, once a
    # minute: `after_request`) may fall on this request in a long run: it writes and
    # reads nothing back, so only SELECTs count as reading history.
    reads = [
        q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")
    ]
    assert reads == []
    assert elapsed < 2.0, f"{segments} segments took {elapsed:.2f} s"


@pytest.mark.django_db
def test_a_63_character_label_is_still_scored():
    label = "-".join(["abcdefg"] * 8)[:63]
    increment_key_nodes(keys=["abcdefg"], node="node1")
    response = APIClient().generic(
        "POST", PRIORITIZE, labelled_body(label), content_type="application/json"
    )
    assert response.status_code == 200, response.content
    scores = {row["Host"]: row["Score"] for row in orjson.loads(response.content)}
    assert scores["node1"] > scores["node2"] == 1


# --- decoded size ---------------------------------------------------------------------


def node_list_body(items: list) -> bytes:
    return orjson.dumps({"Pod": {}, "Nodes": {"metadata": {}, "items": items}})


def real_nodes_up_to(size: int) -> bytes:
    """The recorded Node object of the fixture, renamed and repeated to `size` bytes."""
    node = orjson.loads(load_fixture("prioritize-nodes.json"))["Nodes"]["items"][0]
    one = len(orjson.dumps(node)) + 1
    count = size // one - 1
    items = [
        {**node, "metadata": {**node["metadata"], "name": f"worker-{i}"}}
        for i in range(count)
    ]
    return node_list_body(items)


@pytest.mark.django_db
def test_a_body_of_tiny_objects_is_refused_before_it_is_decoded(settings):
    settings.KSSCHED_MAX_BODY_BYTES = 2 * 2**20
    body = b'{"Pod":{},"Nodes":{"items":[' + b",".join([b"{}"] * 600_000) + b"]}}"
    assert len(body) < settings.KSSCHED_MAX_BODY_BYTES
    started = time.perf_counter()
    response = APIClient().generic(
        "POST", FILTER, body, content_type="application/json"
    )
    elapsed = time.perf_counter() - started
    assert response.status_code == 413, response.content[:200]
    error = orjson.loads(response.content)["Error"]
    assert "once decoded" in error and "over the limit of 16 MiB" in error
    assert elapsed < 2.0


@pytest.mark.django_db
@pytest.mark.parametrize("url", [FILTER, PRIORITIZE])
def test_real_node_lists_up_to_the_body_limit_are_accepted(settings, url):
    settings.KSSCHED_MAX_BODY_BYTES = 2 * 2**20
    body = real_nodes_up_to(settings.KSSCHED_MAX_BODY_BYTES)
    assert len(body) > 0.9 * settings.KSSCHED_MAX_BODY_BYTES
    response = APIClient().generic("POST", url, body, content_type="application/json")
    assert response.status_code == 200, response.content[:300]


def test_the_estimate_bounds_what_decoding_takes():
    import tracemalloc

    for body in (
        real_nodes_up_to(2**20),
        b"[" + b",".join([b"{}"] * 100_000) + b"]",
        b"[" + b",".join([b'{"a":1}'] * 100_000) + b"]",
        b"[" + b",".join([b"1000"] * 100_000) + b"]",
        b"[" + b",".join([b'"x"'] * 100_000) + b"]",
    ):
        tracemalloc.start()
        decoded = orjson.loads(body)
        taken = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del decoded
        assert estimate_decoded_bytes(body) >= taken, body[:40]


# --- chunked bodies, through the real gunicorn ----------------------------------------


def chunked_post(url, path, pieces):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(
            "POST",
            path,
            body=iter(pieces),
            headers={"Content-Type": "application/json", "Host": "localhost"},
            encode_chunked=True,
        )
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def chunked_post_until_answered(url, path, body, piece=8192):
    """Send `body` in chunks, stopping as soon as the server answers (as it does
    past the limit, without reading the rest); return (status, body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: localhost\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            "Connection: close\r\n\r\n"  # the answer is read to the end below
        )
        sock.sendall(head.encode())
        for start in range(0, len(body), piece):
            if select.select([sock], [], [], 0.002)[0]:
                break
            chunk = body[start : start + piece]
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        else:
            sock.sendall(b"0\r\n\r\n")
        received = b""
        while data := sock.recv(65536):
            received += data
    head, _, answer = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), answer


@pytest.mark.django_db(transaction=True)
def test_chunked_bodies_are_read_and_limited():
    body = load_fixture("prioritize-nodenames.json")
    pieces = [body[i : i + 100] for i in range(0, len(body), 100)]
    with run_gunicorn({"KSSCHED_MAX_BODY_BYTES": str(2**20)}, workers=1) as (url, _):
        status, answer = chunked_post(url, PRIORITIZE, pieces)
        assert status == 200, answer
        assert [row["Host"] for row in orjson.loads(answer)] == ["worker-2", "worker-1"]

        status, answer = chunked_post(url, FILTER, pieces)
        assert status == 200, answer
        assert orjson.loads(answer)["NodeNames"] == ["worker-2", "worker-1"]

        # 3 MiB in 8 KiB chunks: refused once past the 1 MiB limit.
        status, answer = chunked_post_until_answered(
            url, FILTER, real_nodes_up_to(3 * 2**20)
        )
        assert status == 413, answer[:200]
        assert orjson.loads(answer)["Error"] == (
            f"chunked request body is over the limit of {2**20} bytes"
        )
