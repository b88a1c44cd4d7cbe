"""Placement quality: warmth recorded at placement time, and hit rates over windows."""

from datetime import UTC, datetime, timedelta

import pytest

from history.models import KeyNode, Placement
from history.services import (
    classify_warmth,
    increment_key_nodes,
    placement_hit_rates,
    record_node_seen,
    record_placement,
)

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
    increment_key_nodes(keys=["a", "b"], node="n1", now=T0)
    row = KeyNode.objects.get(key="b", node="n1")
    KeyNode.objects.filter(pk=row.pk).update(count=0)
    assert classify_warmth(keys=["a", "b"], node="n1") == "partial"
    record_node_seen(name="n1", uid="one", now=T0 - timedelta(days=1))
    record_node_seen(name="n1", uid="two", now=T0 + timedelta(hours=1))
    assert classify_warmth(keys=["a", "b"], node="n1") == "cold"


def test_an_explicit_warmth_is_kept():
    place("u1", "a-b", "n1", warmth="exact")
    assert warmth("u1") == "exact"


def test_hit_rates_overall_and_per_label_over_a_window():
    labels = ["ci-java-app"] * 4 + ["ci-java-lib"] * 2
    for i, label in enumerate(labels):
        place(f"u{i}", label, "n1", at=T0 + timedelta(minutes=i))
    # An old placement outside the window and an unclassified one inside it.
    place("old", "ci-java-app", "n9", at=T0 - timedelta(days=30))
    Placement.objects.create(
        pod_uid="legacy",
        namespace="ci",
        name="x",
        label="ci-java-app",
        node="n1",
        bound_at=T0 + timedelta(minutes=30),
    )
    # app: cold, exact, exact, exact; lib: partial, exact
    rates = placement_hit_rates(since=T0, until=T0 + timedelta(hours=1))
    overall = rates["overall"]
    assert (overall["exact"], overall["partial"], overall["cold"]) == (4, 1, 1)
    assert overall["unclassified"] == 1 and overall["placements"] == 7
    assert overall["exact_rate"] == round(4 / 6, 4)
    assert overall["partial_rate"] == round(1 / 6, 4)
    assert overall["hit_rate"] == round(5 / 6, 4)
    app = rates["by_label"]["ci-java-app"]
    assert (app["exact"], app["cold"], app["exact_rate"]) == (3, 1, 0.75)
    assert rates["by_label"]["ci-java-lib"]["partial_rate"] == 0.5
    everything = placement_hit_rates()
    assert everything["overall"]["cold"] == 2


def test_hit_rates_of_an_empty_window():
    rates = placement_hit_rates(since=T0)
    assert rates == {
        "overall": {
            "placements": 0,
            "exact": 0,
            "partial": 0,
            "cold": 0,
            "unclassified": 0,
            "exact_rate": None,
            "partial_rate": None,
            "hit_rate": None,
        },
        "by_label": {},
    }
