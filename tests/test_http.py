"""End to end over HTTP: the real gunicorn with the shipped config."""

import http.client
import json
from urllib.parse import urlparse

import orjson
import pytest

from history.ledger import increment_key_nodes
from tests.helpers import load_fixture, run_gunicorn

pytestmark = pytest.mark.django_db(transaction=True)


def request(base_url, method, path, body=None, headers=None):
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_gunicorn_answers_prioritize_and_filter(gunicorn_server):
    increment_key_nodes(keys=["pipeline1"], node="worker-1")
    headers = {"Content-Type": "application/json", "Host": "localhost:8080"}
    status, response_headers, body = request(
        gunicorn_server,
        "POST",
        "/scheduler/priorities/pipeline",
        load_fixture("prioritize-nodenames.json"),
        headers,
    )
    assert status == 200, body
    assert orjson.loads(body) == [
        {"Host": "worker-2", "Score": 1},
        {"Host": "worker-1", "Score": 10},
    ]
    # Kept for kube-scheduler's next call (KSSCHED_KEEPALIVE, 100 s by default).
    assert response_headers.get("Connection", "").lower() == "keep-alive"

    status, _, body = request(
        gunicorn_server,
        "POST",
        "/scheduler/predicates/alwaystrue",
        load_fixture("filter-nodes.json"),
        headers,
    )
    assert status == 200
    expected = json.loads(load_fixture("filter-nodes.json"))["Nodes"]
    assert orjson.loads(body)["Nodes"] == expected


def test_gunicorn_bad_input_is_a_json_400_not_a_traceback(gunicorn_server):
    status, headers, body = request(
        gunicorn_server,
        "POST",
        "/scheduler/priorities/pipeline",
        b'{"Pod": 3}',
        {"Content-Type": "application/json"},
    )
    assert status == 400
    assert orjson.loads(body) == {"Error": "Pod must be an object, not int"}
    assert b"Traceback" not in body


def test_gunicorn_version_and_admin_login_page(gunicorn_server):
    status, _, body = request(gunicorn_server, "GET", "/version")
    assert status == 200
    from kssched import __version__

    assert body.decode().strip() == __version__

    status, headers, _ = request(gunicorn_server, "GET", "/admin/")
    assert status == 302
    assert headers["Location"].startswith("/admin/login/")

    # The admin's static files are served by the app itself.
    status, headers, body = request(
        gunicorn_server, "GET", "/static/admin/css/base.css"
    )
    assert status == 200
    assert b"body" in body


def test_gunicorn_rejects_unknown_host(gunicorn_server):
    status, _, _ = request(
        gunicorn_server, "GET", "/version", headers={"Host": "evil.example.com"}
    )
    assert status == 400


def test_gunicorn_scores_with_the_default_warm_strategy():
    from history.ledger import finish_placement, record_placement

    # Two finished placements on worker-1, none on worker-2.
    for uid in ("u1", "u2"):
        record_placement(
            pod_uid=uid,
            namespace="ks-pipelines",
            name=f"pipeline1-{uid}",
            label="pipeline1",
            node="worker-1",
        )
        finish_placement(pod_uid=uid)
    with run_gunicorn(extra_env={"KSSCHED_SCORING": "warm"}) as (url, _process):
        status, _, body = request(
            url,
            "POST",
            "/scheduler/priorities/pipeline",
            load_fixture("prioritize-nodenames.json"),
            {"Content-Type": "application/json"},
        )
        assert status == 200, body
        scores = {row["Host"]: row["Score"] for row in orjson.loads(body)}
        # The warm node outranks the cold one, which scores 1.
        assert scores["worker-2"] == 1
        assert 1 < scores["worker-1"] <= 10

        status, _, body = request(
            url,
            "POST",
            "/scheduler/explain",
            load_fixture("prioritize-nodenames.json"),
            {"Content-Type": "application/json"},
        )
        assert status == 200, body
        explained = orjson.loads(body)
        assert explained["strategy"] == "warm"
        assert {row["node"]: row["score"] for row in explained["nodes"]} == scores


def test_favicon_is_served_at_the_root(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    # An icon directory with one 32 x 32 PNG image.
    assert body[:6] == b"\x00\x00\x01\x00\x01\x00"
    assert body[6:8] == b"\x20\x20"
    assert body[22:30] == b"\x89PNG\r\n\x1a\n"
    assert response["Content-Type"] in ("image/x-icon", "image/vnd.microsoft.icon")
