"""Placement quality: warmth recorded at placement time, and hit rates over windows."""

from datetime import UTC, datetime, timedelta

import pytest

from history.ledger import classify_warmth, record_placement
from history.models import KeyNode, Placement
from history.watcher.state import record_node_seen
from tests.helpers import ran

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def place(uid, label, node, at=T0, **extra):
    return record_placement(
        pod_uid=uid,
        namespace="ci",
        name=uid,
        label=label,
        node=node,
        bound_at=at,
        **extra,
    )


def warmth(uid):
    return Placement.objects.get(pod_uid=uid).warmth


def test_first_pod_on_a_node_is_cold_and_the_next_exact():
    place("u1", "ci-java-app", "n1")
    place("u2", "ci-java-app", "n1")
    assert (warmth("u1"), warmth("u2")) == ("cold", "exact")


def test_a_more_general_segment_warm_is_partial():
    place("u1", "ci-java-app", "n1")
    place("u2", "ci-java-other", "n1")
    place("u3", "ci-go-tool", "n1")
    place("u4", "ci-go-tool", "n2")
    assert [warmth(u) for u in ("u2", "u3", "u4")] == ["partial", "partial", "cold"]


def test_warmth_is_judged_before_the_pod_counts_and_only_once():
    place("u1", "a-b", "n1")
    assert KeyNode.objects.get(key="b", node="n1").count == 1
    # A repeated event changes nothing, not even the stored warmth.
    assert place("u1", "a-b", "n1") is False
    assert warmth("u1") == "cold"


def test_zeroed_rows_and_replaced_nodes_are_cold():
    ran("a-b", node="n1", now=T0)
    at = T0 + timedelta(minutes=1)
    assert classify_warmth(label="a-b", node="n1", at=at) == "exact"
    KeyNode.objects.filter(key="a-b$", node="n1").update(count=0)
    assert classify_warmth(label="a-b", node="n1", at=at) == "partial"
    record_node_seen(name="n1", uid="one", now=T0 - timedelta(days=1))
    record_node_seen(name="n1", uid="two", now=T0 + timedelta(hours=1))
    assert classify_warmth(label="a-b", node="n1", at=at) == "cold"


def test_a_run_past_the_recency_window_is_cold(settings):
    """A run counts while its weight is at least 0.1: 3.3 half-lives."""
    settings.KSSCHED_HALF_LIFE_DAYS = 7
    ran("a-b", node="n1", now=T0)
    assert classify_warmth(label="a-b", node="n1", at=T0 + timedelta(days=23)) == (
        "exact"
    )
    assert classify_warmth(label="a-b", node="n1", at=T0 + timedelta(days=24)) == (
        "cold"
    )


def test_only_this_pipeline_is_exact_and_only_a_shared_prefix_is_partial():
    """Another pipeline with the same last segment is no warmth at all; one under
    the same prefix is partial; only this very label is exact."""
    place("u1", "gitlab-go-build-api", "n1")
    place("u2", "jenkins-java-maven-web", "n2")
    place("u3", "jenkins-java-maven-api", "n3")
    place("u4", "jenkins-python-api", "n4")
    for uid, node in [("v1", "n1"), ("v2", "n2"), ("v3", "n3"), ("v4", "n4")]:
        place(uid, "jenkins-java-maven-api", node)
    assert [warmth(u) for u in ("v1", "v2", "v3", "v4")] == [
        "cold",
        "partial",
        "exact",
        "partial",
    ]
    # A longer label under this one is partial for it, and this one for the longer.
    place("w1", "jenkins-java-maven-api-nightly", "n3")
    place("w2", "jenkins-java-maven-api", "n5")
    place("w3", "jenkins-java-maven-api-nightly", "n5")
    assert [warmth(u) for u in ("w1", "w3")] == ["partial", "partial"]


def test_an_explicit_warmth_is_kept():
    place("u1", "a-b", "n1", warmth="exact")
    assert warmth("u1") == "exact"


def test_each_placement_is_classified_from_the_history_before_it():
    labels = ["ci-java-app"] * 4 + ["ci-java-lib"] * 2
    for i, label in enumerate(labels):
        place(f"u{i}", label, "n1", at=T0 + timedelta(minutes=i))
    # app: cold, exact, exact, exact; lib: partial, exact
    assert [warmth(f"u{i}") for i in range(6)] == [
        "cold",
        "exact",
        "exact",
        "exact",
        "partial",
        "exact",
    ]
