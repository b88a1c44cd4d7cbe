"""Rows of nodes gone longer than the retention period are removed, and the counts
still balance."""

import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from history import audit, ledger
from history.models import CountAdjustment, KeyNode, NodeRecord
from history.watcher import housekeeping
from tests.helpers import placement_counts

pytestmark = pytest.mark.django_db(transaction=True)


def place(uid, label, node, days_ago):
    ledger.record_placement(
        pod_uid=uid,
        namespace="ci",
        name=uid,
        label=label,
        node=node,
        bound_at=timezone.now() - timedelta(days=days_ago),
    )


def age_rows(node, days):
    """Rows last placed and written `days` ago (as a node idle that long has)."""
    then = timezone.now() - timedelta(days=days)
    KeyNode.objects.filter(node=node).update(
        updated=then, last_placed_at=then, decayed_at=then.timestamp()
    )


def test_only_nodes_out_of_the_pool_for_the_retention_period_go():
    place("a", "ci-java-app", "gone-1", days_ago=120)
    place("b", "ci-go", "gone-1", days_ago=100)
    place("c", "ci-java-app", "busy-1", days_ago=1)
    place("d", "ci-go", "seen-1", days_ago=120)
    place("e", "ci-go", "edited-1", days_ago=120)
    for node in ("gone-1", "seen-1", "edited-1"):
        age_rows(node, 100)
    # edited-1's rows were edited in the admin lately: it stays.
    KeyNode.objects.filter(node="edited-1").update(updated=timezone.now())
    # The watcher saw seen-1 lately (first seen or replaced): it stays.
    NodeRecord.objects.create(name="seen-1", uid="u")
    cutoff = timezone.now() - timedelta(days=90)
    assert audit.gone_nodes(before=cutoff) == ["gone-1"]
    removed = audit.prune_gone_nodes(before=cutoff, actor="test")
    # Every key of gone-1's two placements, segments and label path: 10 rows.
    gone = placement_counts(("ci-java-app", "gone-1"), ("ci-go", "gone-1"))
    assert removed == len(gone) == 10
    assert not KeyNode.objects.filter(node="gone-1").exists()
    assert KeyNode.objects.filter(node="busy-1").exists()
    assert KeyNode.objects.filter(node="seen-1").exists()
    assert KeyNode.objects.filter(node="edited-1").exists()
    assert CountAdjustment.objects.filter(
        node="gone-1", reason=CountAdjustment.Reason.NODE_GONE
    ).count() == len(gone)
    pairs, drifts = audit.audit_counts()
    assert pairs > 0 and drifts == []


def test_the_command_lists_then_removes(capsys):
    place("a", "ci-java", "old-node", days_ago=200)
    age_rows("old-node", 200)
    call_command("prune_nodes", "--dry-run")
    assert "old-node" in capsys.readouterr().out
    assert KeyNode.objects.filter(node="old-node").exists()
    call_command("prune_nodes", "--older-than", "90d")
    # ci, java, ci-*, ci-java-*, ci-java$.
    assert "Removed 5 rows" in capsys.readouterr().out
    assert not KeyNode.objects.filter(node="old-node").exists()
    assert audit.audit_counts()[1] == []


def test_the_watchers_housekeeping_prunes_and_stops(settings):
    place("a", "ci-java", "old-node", days_ago=200)
    age_rows("old-node", 200)
    stop = threading.Event()
    wake = threading.Event()
    rounds = []

    def until():
        return stop.is_set()

    original = housekeeping.prune_gone_nodes_now

    def counted():
        rounds.append(original())
        stop.set()
        wake.set()
        return rounds[-1]

    housekeeping.prune_gone_nodes_now = counted
    try:
        housekeeping.run(until, wake, first_after=0.01, every=0.01)
    finally:
        housekeeping.prune_gone_nodes_now = original
    assert rounds == [len(placement_counts(("ci-java", "old-node")))] == [5]
    settings.KSSCHED_NODE_RETENTION_DAYS = 0
    assert housekeeping.prune_gone_nodes_now() == 0
