"""Ledger writes, corrections and the reader's rows against the real database."""

import pytest

from extender.scoring.rules import seed_matches
from history.corrections import delete_key_nodes, set_key_node_count
from history.ledger import finish_placement, increment_key_nodes, record_placement
from history.models import CountAdjustment, KeyNode, Placement
from history.reader import history_reader
from tests.helpers import placement_counts, run_concurrently


def counts():
    return {(r.key, r.node): r.count for r in KeyNode.objects.all()}


@pytest.mark.django_db
def test_increment_creates_then_adds():
    increment_key_nodes(keys=["a", "b"], node="n1")
    increment_key_nodes(keys=["a"], node="n1", by=4)
    assert counts() == {("a", "n1"): 5, ("b", "n1"): 1}


@pytest.mark.django_db
def test_increment_adds_to_existing_count_instead_of_overwriting():
    KeyNode.objects.create(key="a", node="n1", count=5)
    increment_key_nodes(keys=["a"], node="n1")
    assert counts() == {("a", "n1"): 6}


@pytest.mark.django_db
def test_increment_counts_a_repeated_key_once():
    increment_key_nodes(keys=["a", "a"], node="n1")
    assert counts() == {("a", "n1"): 1}


@pytest.mark.django_db(transaction=True)
def test_concurrent_increments_lose_nothing():
    def work():
        for _ in range(50):
            increment_key_nodes(keys=["a", "b"], node="n1")

    assert run_concurrently(4, work) == []
    assert counts() == {("a", "n1"): 200, ("b", "n1"): 200}


@pytest.mark.django_db
def test_record_placement_counts_each_uid_once():
    kwargs = {"namespace": "ns", "name": "p", "label": "ci-java-app", "node": "n1"}
    assert record_placement(pod_uid="u1", **kwargs) is True
    assert record_placement(pod_uid="u1", **kwargs) is False
    assert record_placement(pod_uid="u1", **{**kwargs, "label": "other"}) is False
    assert record_placement(pod_uid="u2", **kwargs) is True
    # Its segments (what seed reads) and its label path (what warm reads), twice.
    assert counts() == {
        **{("ci", "n1"): 2, ("java", "n1"): 2, ("app", "n1"): 2},
        **{("ci-*", "n1"): 2, ("ci-java-*", "n1"): 2, ("ci-java-app-*", "n1"): 2},
        ("ci-java-app$", "n1"): 2,
    }
    assert counts() == placement_counts(("ci-java-app", "n1"), ("ci-java-app", "n1"))
    assert Placement.objects.get(pod_uid="u1").label == "ci-java-app"


@pytest.mark.django_db
def test_finish_placement_closes_once_and_keeps_counts():
    record_placement(pod_uid="u1", namespace="ns", name="p", label="a", node="n1")
    assert finish_placement(pod_uid="u1") is True
    assert finish_placement(pod_uid="u1") is False
    assert Placement.objects.get().finished_at is not None
    assert counts() == {("a", "n1"): 1, ("a-*", "n1"): 1, ("a$", "n1"): 1}


@pytest.mark.django_db
def test_set_count_records_an_adjustment():
    key_node = KeyNode.objects.create(key="a", node="n1", count=7)
    assert set_key_node_count(key_node=key_node, count=2, actor="alice") == -5
    assert counts() == {("a", "n1"): 2}
    adjustment = CountAdjustment.objects.get()
    assert (adjustment.delta, adjustment.actor, adjustment.reason) == (
        -5,
        "alice",
        "admin_edit",
    )
    with pytest.raises(ValueError):
        set_key_node_count(key_node=key_node, count=-1, actor="alice")


@pytest.mark.django_db
def test_set_count_keeps_a_placement_recorded_after_the_form_was_read():
    key_node = KeyNode.objects.create(key="a", node="n1", count=7)
    stale = KeyNode.objects.get(pk=key_node.pk)
    increment_key_nodes(keys=["a"], node="n1")
    set_key_node_count(key_node=stale, count=3, actor="bob")
    assert counts() == {("a", "n1"): 3}
    assert CountAdjustment.objects.get().delta == -5


@pytest.mark.django_db
def test_delete_records_removed_counts():
    rows = [
        KeyNode.objects.create(key="a", node="n1", count=4),
        KeyNode.objects.create(key="b", node="n1", count=0),
    ]
    assert delete_key_nodes(key_nodes=rows, actor="carol") == 2
    assert counts() == {}
    assert list(CountAdjustment.objects.values_list("key", "delta")) == [("a", -4)]


def best_matches(*, keys, nodes):
    """The seed formula's best match per node, from what the reader returns."""
    history = history_reader().read(keys=keys, label="-".join(keys), nodes=nodes)
    return seed_matches(keys=keys, rows=history.rows, nodes=nodes)


@pytest.mark.django_db
def test_best_matches_picks_most_specific_key_per_node():
    for key, node, count in [
        ("ci", "n1", 50),
        ("java", "n1", 3),
        ("ci", "n2", 9),
        ("app", "n3", 0),
        ("ci", "n3", 2),
        ("app", "elsewhere", 5),
    ]:
        KeyNode.objects.create(key=key, node=node, count=count)
    matches = best_matches(keys=["ci", "java", "app"], nodes=["n1", "n2", "n3", "n4"])
    assert matches == {"n1": (1, 3), "n2": (0, 9), "n3": (0, 2)}


@pytest.mark.django_db
def test_best_matches_clamps_huge_counts():
    KeyNode.objects.create(key="a", node="n1", count=10**15)
    assert best_matches(keys=["a"], nodes=["n1"]) == {"n1": (0, 999_999)}


@pytest.mark.django_db
def test_best_matches_repeated_segment_counts_at_most_specific_position():
    KeyNode.objects.create(key="a", node="n1", count=1)
    assert best_matches(keys=["a", "b", "a"], nodes=["n1"]) == {"n1": (2, 1)}


@pytest.mark.django_db
def test_keynode_count_cannot_go_negative():
    from django.db import IntegrityError

    with pytest.raises(IntegrityError):
        KeyNode.objects.create(key="a", node="n1", count=-1)
