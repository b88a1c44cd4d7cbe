"""Input that could exhaust a worker: label values no pod can carry, chunked bodies,
bodies whose parsed form would not fit the worker's memory."""

import time

import orjson
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from extender.serializers import is_valid_label_value
from history.services import increment_key_nodes

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
    assert len(queries) == 0
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
