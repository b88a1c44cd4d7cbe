"""Ledger retention: the watcher's daily housekeeping prunes the ledger rows of pods
that ended longer ago than KSSCHED_LEDGER_RETENTION_DAYS (default 90), without
changing a count; a bad value stops startup with a line naming it."""

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from history import audit
from history.models import CountAdjustment, KeyNode, Placement
from history.watcher import housekeeping
from tests.helpers import place
from tests.test_settings import run_manage


def counts():
    return dict(
        ((key, node), count)
        for key, node, count in KeyNode.objects.values_list("key", "node", "count")
    )


@pytest.mark.django_db(transaction=True)
def test_the_watchers_housekeeping_prunes_the_ledger_past_retention(settings):
    settings.KSSCHED_LEDGER_RETENTION_DAYS = 30
    place(
        "old", "ci-java", "n1", finished_ago=timedelta(days=40), ago=timedelta(days=41)
    )
    place(
        "recent",
        "ci-java",
        "n1",
        finished_ago=timedelta(days=10),
        ago=timedelta(days=11),
    )
    place("running", "ci-go", "n2", ago=timedelta(days=100))
    before = counts()
    stop, wake, rounds = threading.Event(), threading.Event(), []
    original = housekeeping.prune_ledger_now

    def counted():
        rounds.append(original())
        stop.set()
        wake.set()
        return rounds[-1]

    housekeeping.prune_ledger_now = counted
    try:
        housekeeping.run(stop.is_set, wake, first_after=0.01, every=0.01)
    finally:
        housekeeping.prune_ledger_now = original
    assert rounds == [1]
    assert set(Placement.objects.values_list("pod_uid", flat=True)) == {
        "recent",
        "running",
    }
    assert counts() == before
    assert CountAdjustment.objects.filter(reason="pruned").exists()
    assert audit.audit_counts()[1] == []
    settings.KSSCHED_LEDGER_RETENTION_DAYS = 0
    place(
        "old-2",
        "ci-java",
        "n1",
        finished_ago=timedelta(days=400),
        ago=timedelta(days=401),
    )
    assert housekeeping.prune_ledger_now() == 0


@pytest.mark.django_db
def test_pruning_goes_a_page_at_a_time_and_keeps_every_count(monkeypatch):
    monkeypatch.setattr(audit, "PAGE", 3)
    for i in range(10):
        place(f"u{i}", f"ci-app{i % 2}", f"n{i % 3}", finished_ago=timedelta(days=50))
    place("kept", "ci-app0", "n0", finished_ago=timedelta(days=1))
    before = counts()
    cutoff = timezone.now() - timedelta(days=30)
    assert audit.prune_placements(before=cutoff, actor="test") == 10
    assert list(Placement.objects.values_list("pod_uid", flat=True)) == ["kept"]
    assert counts() == before
    assert audit.audit_counts()[1] == []


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", "36501", "²"])
def test_a_bad_ledger_retention_stops_startup_naming_it(tmp_path, value):
    env = {
        "SECRET_KEY": "test-secret",
        "DATA_PATH": str(tmp_path),
        "KSSCHED_LEDGER_RETENTION_DAYS": value,
    }
    result = run_manage(["check"], env)
    assert result.returncode != 0
    assert f"KSSCHED_LEDGER_RETENTION_DAYS={value!r} is not valid" in result.stderr
    assert "Traceback" not in result.stderr.splitlines()[-1]


def test_the_ledger_is_pruned_after_90_days_by_default(tmp_path):
    show = (
        "from django.conf import settings; "
        "print(settings.KSSCHED_LEDGER_RETENTION_DAYS)"
    )
    result = run_manage(
        ["shell", "-c", show], {"SECRET_KEY": "test-secret", "DATA_PATH": str(tmp_path)}
    )
    assert result.stdout.splitlines()[-1] == "90", result.stderr
