"""audit_counts and prune_placements: drift is found, intent is not, totals stay."""

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from history import corrections, ledger
from history.labels import key_kind
from history.models import CountAdjustment, KeyNode, Placement
from tests.helpers import placement_counts

pytestmark = pytest.mark.django_db


def place(uid, label, node, *, finished_days_ago=None, bound_days_ago=0):
    now = timezone.now()
    ledger.record_placement(
        pod_uid=uid,
        namespace="ns",
        name=uid,
        label=label,
        node=node,
        bound_at=now - timedelta(days=bound_days_ago),
    )
    if finished_days_ago is not None:
        ledger.finish_placement(
            pod_uid=uid, finished_at=now - timedelta(days=finished_days_ago)
        )


def audit(*args):
    out = io.StringIO()
    try:
        call_command("audit_counts", *args, stdout=out)
    except SystemExit as exc:
        return exc.code, out.getvalue()
    return 0, out.getvalue()


def counts():
    return {(k.key, k.node): k.count for k in KeyNode.objects.all()}


def test_a_balanced_history_has_no_drift():
    place("u1", "a-b", "n1")
    place("u2", "a-c", "n1")
    place("u3", "a-a", "n2")  # a repeated segment counts once
    code, out = audit()
    assert code == 0
    # Every key of every placement: 4 segment pairs and 8 of the label paths.
    assert "Checked 12 key/node pairs: no drift." in out
    assert counts() == placement_counts(("a-b", "n1"), ("a-c", "n1"), ("a-a", "n2"))
    segments = {
        pair: n for pair, n in counts().items() if key_kind(pair[0]) == "segment"
    }
    assert segments == {("a", "n1"): 2, ("b", "n1"): 1, ("c", "n1"): 1, ("a", "n2"): 1}
    assert counts()[("a-*", "n1")] == 2 and counts()[("a-a$", "n2")] == 1


def test_a_count_moved_behind_the_ledgers_back_is_drift():
    place("u1", "a-b", "n1")
    KeyNode.objects.filter(key="b").update(count=5)
    KeyNode.objects.create(key="ghost", node="n9", count=2)
    code, out = audit()
    assert code == 1
    assert "DRIFT b on n1: count 5, expected 1" in out
    assert "off by +4" in out
    assert "DRIFT ghost on n9: count 2, expected 0" in out
    code, out = audit("--json")
    report = json.loads(out)
    # a, b, a-*, a-b-* and a-b$ on n1, and the ghost.
    assert report["checked"] == 6
    assert {(d["key"], d["difference"]) for d in report["drift"]} == {
        ("b", 4),
        ("ghost", 2),
    }


def test_admin_edits_resets_and_deletions_are_not_drift():
    place("u1", "a-b", "n1")
    place("u2", "a", "n1")
    a = KeyNode.objects.get(key="a", node="n1")
    corrections.set_key_node_count(key_node=a, count=10, actor="admin")
    corrections.create_key_node(key="manual", node="n3", count=4, actor="admin")
    corrections.delete_key_nodes(key_nodes=KeyNode.objects.filter(key="b"), actor="x")
    place("u3", "b", "n1")  # recreated after the deletion
    assert audit()[0] == 0
    assert counts()[("b", "n1")] == 1


def test_prune_removes_old_finished_rows_and_keeps_every_total():
    place("old1", "a-b", "n1", finished_days_ago=40, bound_days_ago=41)
    place("old2", "a", "n1", finished_days_ago=31, bound_days_ago=31)
    place("recent", "a-b", "n1", finished_days_ago=2, bound_days_ago=2)
    place("running", "a", "n2", bound_days_ago=60)
    before = counts()
    out = io.StringIO()
    call_command("prune_placements", "--older-than", "30d", "--dry-run", stdout=out)
    assert "Would prune 2 placements" in out.getvalue()
    assert Placement.objects.count() == 4
    call_command("prune_placements", "--older-than", "30d", stdout=out)
    assert set(Placement.objects.values_list("pod_uid", flat=True)) == {
        "recent",
        "running",
    }
    assert counts() == before
    pruned = {
        (a.key, a.node): a.delta
        for a in CountAdjustment.objects.filter(reason="pruned")
    }
    # What the two pruned placements (a-b and a on n1) counted under.
    assert pruned == placement_counts(("a-b", "n1"), ("a", "n1"))
    assert pruned[("a", "n1")] == 2 and pruned[("a-b$", "n1")] == 1
    assert audit()[0] == 0
    call_command(
        "prune_placements", "--older-than", "45d", "--include-unfinished", stdout=out
    )
    assert set(Placement.objects.values_list("pod_uid", flat=True)) == {"recent"}
    assert counts() == before
    assert audit()[0] == 0


@pytest.mark.parametrize("age", ["", "0d", "-3d", "30x", "d"])
def test_prune_rejects_a_bad_age(age):
    with pytest.raises(CommandError, match="invalid age"):
        call_command("prune_placements", f"--older-than={age}")


def test_prune_ages_accept_units():
    from history.management.commands.prune_placements import parse_age

    assert parse_age("30d") == timedelta(days=30)
    assert parse_age("12h") == timedelta(hours=12)
    assert parse_age("2w") == timedelta(weeks=2)
    assert parse_age("7") == timedelta(days=7)
