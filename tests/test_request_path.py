"""The fast path for large extender bodies: the collector is paused while a big
body is decoded and back on at the next request, and the decoded body does not
outlive its response."""

import gc

import orjson
import pytest
from rest_framework.test import APIClient

from extender import parsers

FILTER_URL = "/scheduler/predicates/alwaystrue"

pytestmark = pytest.mark.django_db


def big_body(count=10000):
    return orjson.dumps(
        {
            "Pod": {"metadata": {"name": "p"}},
            "Nodes": None,
            "NodeNames": [f"node-with-a-long-name-{i:06d}" for i in range(count)],
        }
    )


def test_large_body_pauses_the_collector_until_the_next_request():
    client = APIClient()
    body = big_body()
    assert len(body) > parsers._GC_PAUSE_BYTES
    assert gc.isenabled()
    try:
        response = client.generic("POST", FILTER_URL, body, "application/json")
        assert response.status_code == 200
        assert len(orjson.loads(response.content)["NodeNames"]) == 10000
        assert not gc.isenabled()
        small = orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": ["a"]})
        response = client.generic("POST", FILTER_URL, small, "application/json")
        assert response.status_code == 200
        assert gc.isenabled()
    finally:
        parsers.resume_gc()


def test_small_body_leaves_the_collector_alone():
    body = orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": ["a", "b"]})
    response = APIClient().generic("POST", FILTER_URL, body, "application/json")
    assert response.status_code == 200
    assert gc.isenabled()


def test_decoded_body_is_freed_when_the_response_closes():
    """No reference cycle keeps the decoded body alive once the response is closed."""
    client = APIClient()
    marker = "node-that-must-be-freed"
    body = orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": [marker] * 10})
    gc.collect()
    try:
        gc.disable()
        response = client.generic("POST", FILTER_URL, body, "application/json")
        response.close()
        lists = [o for o in gc.get_objects() if type(o) is list and marker in o[:1]]
        assert lists == [], "the decoded NodeNames list is still alive"
    finally:
        gc.enable()


def test_extender_answers_json_whatever_accept_says_and_still_checks_content_type():
    client = APIClient()
    body = orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": ["a"]})
    response = client.generic(
        "POST", FILTER_URL, body, "application/json", HTTP_ACCEPT="text/html"
    )
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert orjson.loads(response.content)["NodeNames"] == ["a"]
    response = client.generic("POST", FILTER_URL, body, "text/plain")
    assert response.status_code == 415


def test_site_middleware_is_skipped_on_extender_routes_only(client):
    body = orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": ["a"]})
    response = client.generic("POST", FILTER_URL, body, "application/json")
    assert response.status_code == 200
    assert not hasattr(response.wsgi_request, "session")
    assert not hasattr(response.wsgi_request, "_messages")
    response = client.get("/admin/login/")
    assert response.status_code == 200
    assert hasattr(response.wsgi_request, "session")
    assert hasattr(response.wsgi_request, "_messages")
