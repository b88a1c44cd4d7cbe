"""The fast path for large extender bodies: the collector is paused while a big
body is decoded and back on at the next request, and the decoded body does not
outlive its response."""

import gc

import orjson
import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.test import RequestFactory
from prometheus_client import REGISTRY
from rest_framework.parsers import FormParser
from rest_framework.permissions import AllowAny
from rest_framework.test import APIClient

from extender import parsers, views
from extender.views import AlwaysTruePredicateView, PipelinePriorityView
from extender.wire import HostPriorityList, unique_names
from kssched import middleware
from tests import admission_reviews

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


def test_site_middleware_is_skipped_on_the_machines_routes_only(client):
    body = orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": ["a"]})
    response = client.generic("POST", FILTER_URL, body, "application/json")
    assert response.status_code == 200
    assert not hasattr(response.wsgi_request, "session")
    assert not hasattr(response.wsgi_request, "_messages")
    response = admission_reviews.post(
        client, admission_reviews.review(admission_reviews.new_pod())
    )
    assert response.status_code == 200
    assert orjson.loads(response.content)["response"]["allowed"] is True
    assert not hasattr(response.wsgi_request, "session")
    assert not hasattr(response.wsgi_request, "_messages")
    response = client.get("/admin/login/")
    assert response.status_code == 200
    assert hasattr(response.wsgi_request, "session")
    assert hasattr(response.wsgi_request, "_messages")


PRIORITIZE_URL = "/scheduler/priorities/pipeline"

AWKWARD_NAMES = [
    'ends-with-quote-comma",',
    'has","inside',
    "back\\slash",
    "tab\tand\nnewline",
    "\x00nul",
    "ünïcødé-node",
    "emoji-\U0001f680",
    "",
]


def dicts_json(nodes, scores):
    pairs = zip(nodes, scores, strict=True)
    return orjson.dumps([{"Host": node, "Score": score} for node, score in pairs])


@pytest.mark.parametrize(
    "nodes",
    [
        [],
        ["a"],
        [f"ip-10-0-{i}-17.eu-west-1.internal" for i in range(1000)],
        ["ünïcødé-node", "plain", "emoji-\U0001f680", ""],
        *[[name] for name in AWKWARD_NAMES],
        ["plain-1", *AWKWARD_NAMES, "plain-2"],
    ],
)
def test_host_priority_list_writes_what_orjson_writes_for_the_dicts(nodes):
    scores = [i % 11 for i in range(len(nodes))]
    reply = HostPriorityList(nodes, scores)
    assert reply.to_json() == dicts_json(nodes, scores)
    assert orjson.loads(reply.to_json()) == orjson.loads(dicts_json(nodes, scores))
    assert list(reply) == orjson.loads(reply.to_json())
    assert len(reply) == len(nodes)


@pytest.mark.parametrize("odd", [11, -1, 2**40, 2.5, None, [3]])
def test_host_priority_list_scores_outside_0_to_10_take_the_general_path(odd):
    nodes = ["a", "b", "c"]
    for scores in ([odd, 1, 2], [1, odd, 2], [1, 2, odd]):
        assert HostPriorityList(nodes, scores).to_json() == dicts_json(nodes, scores)
    assert HostPriorityList(["a"], [odd]).to_json() == dicts_json(["a"], [odd])


def test_host_priority_list_needs_one_score_per_node():
    with pytest.raises(ValueError, match="2 scores for 3 nodes"):
        HostPriorityList(["a", "b", "c"], [1, 2])


def test_unique_names_keeps_the_list_when_nothing_repeats():
    names = ["a", "b", "c"]
    assert unique_names(names) is names
    assert unique_names(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]
    assert unique_names([]) == []


def test_prioritize_answers_awkward_names_as_valid_json(client):
    # A NUL character is refused with a 400 (tests/test_extender.py).
    awkward = [name for name in AWKWARD_NAMES if "\x00" not in name]
    names = ["plain", *awkward, "plain"]
    body = orjson.dumps({"Pod": {"metadata": {}}, "Nodes": None, "NodeNames": names})
    response = client.generic("POST", PRIORITIZE_URL, body, "application/json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    reply = orjson.loads(response.content)
    assert [entry["Host"] for entry in reply] == ["plain", *awkward]
    assert all(set(entry) == {"Host", "Score"} for entry in reply)
    assert all(type(entry["Score"]) is int for entry in reply)


def test_extender_views_share_their_stateless_drf_components():
    first, second = PipelinePriorityView(), AlwaysTruePredicateView()
    assert first.get_parsers() is second.get_parsers()
    assert first.get_renderers() is second.get_renderers()
    assert first.get_content_negotiator() is second.get_content_negotiator()
    assert [type(p) for p in first.get_permissions()] == [AllowAny]
    assert first.get_throttles() == []

    class TextOnly(AlwaysTruePredicateView):
        parser_classes = [FormParser]

    assert [type(p) for p in TextOnly().get_parsers()] == [FormParser]


def test_extender_answers_options_with_405_and_allows_post_only(client):
    response = client.options(FILTER_URL)
    assert response.status_code == 405
    assert response["Allow"] == "POST"
    assert "OPTIONS" in orjson.loads(response.content)["Error"]
    body = orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": ["a"]})
    response = client.generic("POST", PRIORITIZE_URL, body, "application/json")
    assert response["Allow"] == "POST"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize(
    "content_type, status",
    [
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("APPLICATION/JSON", 200),
        ("application/*", 415),
        ("*/*", 415),
        ("text/plain", 415),
        ("application/jsonx", 415),
    ],
)
def test_extender_needs_a_json_content_type(client, content_type, status):
    body = orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": ["a"]})
    response = client.generic("POST", PRIORITIZE_URL, body, content_type)
    assert response.status_code == status
    if status == 200:
        assert orjson.loads(response.content) == [{"Host": "a", "Score": 0}]
    else:
        assert content_type in orjson.loads(response.content)["Error"]


def _request_count(verb):
    return (
        REGISTRY.get_sample_value(
            "kssched_extender_request_seconds_count", {"verb": verb}
        )
        or 0
    )


def test_metrics_are_recorded_when_the_response_closes(settings):
    """The reply is complete before its metrics are written (at close)."""
    verb = "priorities/pipeline"
    before = _request_count(verb)
    body = orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": ["a", "b"]})
    request = RequestFactory().generic(
        "POST", PRIORITIZE_URL, body, "application/json", REMOTE_ADDR="127.0.0.1"
    )
    response = WSGIHandler().get_response(request)
    assert response.status_code == 200
    assert orjson.loads(response.content) == [
        {"Host": "a", "Score": 0},
        {"Host": "b", "Score": 0},
    ]
    assert _request_count(verb) == before
    response.close()
    assert _request_count(verb) == before + 1


def test_a_failing_metric_is_logged_not_hidden(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("metrics store unavailable")

    monkeypatch.setattr(middleware, "observe_extender_request", broken)
    body = orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": ["a"]})
    response = APIClient().generic("POST", FILTER_URL, body, "application/json")
    assert response.status_code == 200
    assert "Could not record metrics for /scheduler/predicates/alwaystrue" in (
        caplog.text
    )
    assert "metrics store unavailable" in caplog.text


def test_a_failing_answer_metric_is_logged_and_the_reply_stands(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("answer metrics unavailable")

    monkeypatch.setattr(views, "observe_extender_answer", broken)
    body = orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": ["a"]})
    response = APIClient().generic("POST", PRIORITIZE_URL, body, "application/json")
    assert response.status_code == 200
    assert orjson.loads(response.content) == [{"Host": "a", "Score": 0}]
    assert "Could not record metrics for /scheduler/priorities/pipeline" in (
        caplog.text
    )
    assert "answer metrics unavailable" in caplog.text
