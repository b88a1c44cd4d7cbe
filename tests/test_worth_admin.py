"""What warmth is worth on the admin pipeline page: the saving an exact placement
brings, its interval and runs, and the weight the pull gets and why."""

import re

import pytest

from history.models import KeyPolicy
from history.worth_samples import MIN_RUNS
from tests.helpers import succeeded

pytestmark = pytest.mark.django_db


def runs(label, warmth, startups, run=100.0, *, prefix=""):
    for i, startup in enumerate(startups):
        succeeded(f"{prefix or label}-{warmth}-{i}", label, warmth, startup, run)


def typical(pipelines=3, saving=30.0):
    """Sibling pipelines that save `saving` s each: the fleet's unit of worth."""
    for n in range(pipelines):
        label = f"ci-java-t{n}"
        runs(label, "exact", [10.0 + i % 3 for i in range(MIN_RUNS)])
        runs(label, "cold", [10.0 + saving + i % 3 for i in range(MIN_RUNS)])


def block(admin_client, label) -> str:
    body = admin_client.get("/admin/pipeline/", {"q": label}).content.decode()
    found = re.search(
        r'<div class="module" id="pipeline-worth">(.*?)</div>', body, re.S
    )
    assert found, "no worth block on the page"
    return re.sub(r"\s+", " ", found.group(1))


def test_a_pipeline_warmth_helps_shows_its_saving_interval_runs_and_weight(
    admin_client, warm
):
    typical(saving=30.0)
    runs("ci-java-big", "exact", [10.0 + i for i in range(MIN_RUNS)])
    runs("ci-java-big", "cold", [70.0 + i for i in range(MIN_RUNS)])
    runs("ci-java-big", "partial", [40.0, 41.0, 42.0])
    text = block(admin_client, "ci-java-big")
    # Medians: cold 73.5, exact 13.5; over partial and cold together 58.5 s.
    assert "An exact placement saves about <strong>58.5 s</strong>" in text
    assert "(8 exact, 3 partial, 8 cold runs; interval 26–64 s): startup only" in text
    assert "Startup over cold runs: 1 min 0 s (interval 55–65 s; 8 exact vs 8 cold" in (
        text
    )
    assert "; measurable)" in text
    assert "Startup over partial runs: 27.5 s" in text
    assert "too few runs to tell, 8 of each needed" in text
    assert "Run time over other runs: 0 s" in text and "not counted" in text
    # Twice what its typical siblings save, shrunk a little toward them.
    assert re.search(
        r"Weight in use: <strong>1.5</strong> \(worth 1.\d\dx a typical", text
    )
    assert 'id="worth-none"' not in text


def test_run_time_is_counted_when_it_differs_measurably(admin_client, warm):
    typical()
    for i in range(MIN_RUNS):
        succeeded(f"e{i}", "ci-java-run", "exact", 10.0, 100.0 + i)
        succeeded(f"c{i}", "ci-java-run", "cold", 40.0, 400.0 + i)
    text = block(admin_client, "ci-java-run")
    assert "saves about <strong>5 min 30 s</strong>" in text
    assert "startup and run time, the run times differing measurably" in text
    assert "Run time over other runs: 5 min 0 s" in text
    assert "counted in the saving" in text


def test_a_pipeline_warmth_does_not_help_gets_weight_zero(admin_client, warm):
    typical()
    for i in range(MIN_RUNS):
        succeeded(f"e{i}", "ci-java-flat", "exact", 10.0 + i % 4, 100.0)
        succeeded(f"c{i}", "ci-java-flat", "cold", 11.0 - i % 4, 100.0)
    text = block(admin_client, "ci-java-flat")
    assert "Weight in use: <strong>0</strong>" in text
    assert "saves nothing measurable: its interval holds 0" in text
    assert "not measurable: its interval holds 0" in text


def test_no_outcomes_yet_is_todays_pull(admin_client, warm):
    succeeded("e0", "ci-java-other", "exact", 10.0, 100.0)
    text = block(admin_client, "ci-java-new")
    assert 'id="worth-none"' in text
    assert "the pipeline gets weight 1, today's pull" in text
    assert "Weight in use: <strong>1</strong> (no outcomes yet" in text
    assert 'id="worth-saving"' not in text
    # Exact runs only: nothing to compare them with.
    text = block(admin_client, "ci-java-other")
    assert "Not known yet (1 exact, 0 partial, 0 cold runs)" in text


def test_a_key_policy_overrides_the_learned_weight(admin_client, warm):
    typical()
    runs("ci-java-big", "exact", [10.0 + i for i in range(MIN_RUNS)])
    runs("ci-java-big", "cold", [70.0 + i for i in range(MIN_RUNS)])
    KeyPolicy.objects.create(key="java", weight=1.5, worth="fixed")
    text = block(admin_client, "ci-java-big")
    assert (
        "Weight in use: <strong>1.5</strong> (fixed by key policy java: weight 1.5"
        in (text)
    )
    assert re.search(r"; learned 1.5: worth 1.\d\dx [^)]*\(not applied\)", text)
    # The most specific segment with a policy decides.
    KeyPolicy.objects.create(key="big", worth="off")
    text = block(admin_client, "ci-java-big")
    assert "Weight in use: <strong>0</strong> (off by key policy big: no warm pull" in (
        text
    )
    KeyPolicy.objects.filter(key="big").update(worth="auto", weight=2.0)
    text = block(admin_client, "ci-java-big")
    assert "times key policy big&#x27;s weight 2" in text
    KeyPolicy.objects.filter(key="big").update(enabled=False)
    text = block(admin_client, "ci-java-big")
    assert "Weight in use: <strong>none</strong> (opted out by key policy big" in text


def test_worth_off_gives_every_pipeline_weight_one(admin_client, warm, settings):
    settings.KSSCHED_WORTH = "off"
    typical()
    runs("ci-java-big", "exact", [10.0 + i for i in range(MIN_RUNS)])
    runs("ci-java-big", "cold", [70.0 + i for i in range(MIN_RUNS)])
    text = block(admin_client, "ci-java-big")
    assert "saves about <strong>1 min 0 s</strong>" in text
    assert (
        "Weight in use: <strong>1</strong> (KSSCHED_WORTH is off: every pipeline"
        in (text)
    )
    assert re.search(r"pull; learned 1.5: worth 1.\d\dx a typical", text)


def test_the_seed_strategy_does_not_weigh_worth(admin_client, settings):
    settings.KSSCHED_SCORING = "seed"
    text = block(admin_client, "ci-java-big")
    assert "the seed strategy does not weigh what warmth is worth" in text


def test_the_labels_words_are_escaped(admin_client, warm):
    label = "ci-<b>x</b>"
    succeeded("e0", label, "exact", 10.0, 100.0)
    body = admin_client.get("/admin/pipeline/", {"q": label}).content.decode()
    assert "<b>x</b>" not in body


def test_outcomes_that_cannot_be_read_are_said_so(admin_client, warm, monkeypatch):
    from history.worth_feed import LedgerWorth

    monkeypatch.setattr(LedgerWorth, "refresh", lambda self, **kwargs: False)
    text = block(admin_client, "ci-java-app")
    assert 'id="worth-unread"' in text
    assert "Weight in use: <strong>1</strong>" in text
