"""Outcomes: the ledger keeps the first times it is given, and one report
(`history.outcomes`) serves the command, the API and the admin."""

from datetime import timedelta
from io import StringIO

import orjson
import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from history import outcomes
from history.ledger import RecordedOutcome, record_outcome, record_placement
from history.models import Placement

pytestmark = pytest.mark.django_db

EMPTY = {
    "runs": 0,
    "failed": 0,
    "startup_p50": None,
    "startup_p90": None,
    "run_p50": None,
    "run_p90": None,
}


def placed(uid, label="ci-java-app", warmth="exact", ago=timedelta(hours=1)):
    record_placement(
        pod_uid=uid,
        namespace="ci",
        name=f"pod-{uid}",
        label=label,
        node="n1",
        bound_at=timezone.now() - ago,
        warmth=warmth,
    )


def ran(uid, startup, run, outcome="Succeeded", **kw):
    placed(uid, **kw)
    record_outcome(pod_uid=uid, startup=startup, run=run, outcome=outcome)


def stored(uid):
    row = Placement.objects.get(pod_uid=uid)
    return row.startup_seconds, row.run_seconds, row.outcome


# --------------------------------------------------------------------------- ledger


def test_the_first_observation_of_each_value_wins():
    placed("u1", warmth="partial")
    assert record_outcome(pod_uid="u1", startup=12, run=None, outcome="") is None
    # A later state with another start (a restarted container) changes nothing.
    assert record_outcome(pod_uid="u1", startup=99, run=None, outcome="") is None
    assert stored("u1") == (12, None, "")
    recorded = record_outcome(pod_uid="u1", startup=15, run=300, outcome="Succeeded")
    assert recorded == RecordedOutcome(
        warmth="partial", outcome="Succeeded", startup=12, run=300
    )
    # Replays of the end, and of an older running state, change nothing.
    assert record_outcome(pod_uid="u1", startup=1, run=1, outcome="Failed") is None
    assert record_outcome(pod_uid="u1", startup=2, run=None, outcome="") is None
    assert stored("u1") == (12, 300, "Succeeded")


def test_an_outcome_without_times_still_closes_the_row():
    placed("u2")
    assert record_outcome(pod_uid="u2", startup=None, run=None, outcome="Failed")
    # A replayed running state must not add a startup after the end.
    record_outcome(pod_uid="u2", startup=5, run=None, outcome="")
    assert stored("u2") == (None, None, "Failed")


def test_a_pod_outside_the_ledger_is_ignored():
    assert record_outcome(pod_uid="nobody", startup=1, run=2, outcome="Failed") is None
    assert not Placement.objects.exists()


# --------------------------------------------------------------------------- report


def test_median_and_nearest_rank_p90():
    assert outcomes.median([]) is None
    assert outcomes.median([3, 1, 2]) == 2
    assert outcomes.median([4, 1, 3, 2]) == 2.5
    assert outcomes.p90([]) is None
    assert outcomes.p90([5]) == 5
    assert outcomes.p90(list(range(1, 11))) == 9
    assert outcomes.p90(list(range(1, 12))) == 10
    assert outcomes.p90(list(range(1, 21))) == 18


def test_report_by_warmth_and_label_over_successful_runs():
    for i, (startup, run) in enumerate([(10, 100), (20, 200), (30, 300), (40, 400)]):
        ran(f"e{i}", startup, run)
    ran("f1", 5, 50, outcome="Failed")
    ran("c1", 300, 700, warmth="cold")
    ran("o1", 60, 600, label="ci-go-svc", warmth="partial")
    # Unusable times, a running pod, a pod outside the window: not in any figure.
    ran("x1", None, None)
    ran("x2", 7, None, outcome="")
    ran("old", 1, 1, ago=timedelta(days=31))
    report = outcomes.outcome_report()
    java = {
        "runs": 4,
        "failed": 1,
        "startup_p50": 25,
        "startup_p90": 40,
        "run_p50": 250,
        "run_p90": 400,
    }
    cold = {"runs": 1, "failed": 0, "startup_p50": 300, "startup_p90": 300}
    cold |= {"run_p50": 700, "run_p90": 700}
    go = {"runs": 1, "failed": 0, "startup_p50": 60, "startup_p90": 60}
    go |= {"run_p50": 600, "run_p90": 600}
    assert report["overall"] == {"exact": java, "partial": go, "cold": cold}
    assert [p["label"] for p in report["pipelines"]] == ["ci-go-svc", "ci-java-app"]
    assert report["pipelines"][1] == {
        "label": "ci-java-app",
        "exact": java,
        "partial": EMPTY,
        "cold": cold,
        "saved_seconds": None,
        "saved_reason": "needs at least 5 successful exact and 5 cold runs; "
        "has 4 exact and 1 cold",
    }
    assert outcomes.outcome_report(label="go")["pipelines"] == [report["pipelines"][0]]
    assert outcomes.outcome_report(label="ci-java")["overall"]["partial"] == EMPTY


def test_time_saved_needs_five_successful_runs_of_each_class():
    for i in range(5):
        ran(f"e{i}", 10, 100 + i)  # startup+run: 110..114, median 112
        ran(f"c{i}", 200, 300 + 2 * i, warmth="cold")  # 500..508, median 504
    ran("e-failed", 10, 1, outcome="Failed")
    [pipeline] = outcomes.outcome_report()["pipelines"]
    assert pipeline["saved_seconds"] == (504 - 112) * 5
    assert pipeline["saved_reason"] is None
    assert outcomes.total_saved(outcomes.outcome_report()) == ((504 - 112) * 5, 1)
    Placement.objects.filter(pod_uid="c0").update(outcome="Failed")
    [pipeline] = outcomes.outcome_report()["pipelines"]
    assert pipeline["saved_seconds"] is None
    assert "has 5 exact and 4 cold" in pipeline["saved_reason"]


def test_since_narrows_the_window():
    ran("new", 1, 2, ago=timedelta(hours=1))
    ran("week", 3, 4, ago=timedelta(days=7))
    since = timezone.now() - timedelta(days=2)
    report = outcomes.outcome_report(since=since)
    assert report["overall"]["exact"]["runs"] == 1
    assert report["since"] == outcomes.parse_instant(since.isoformat()).isoformat()
    assert outcomes.outcome_report()["overall"]["exact"]["runs"] == 2


def test_parse_instant_accepts_dates_and_date_times():
    assert outcomes.parse_instant("2026-11-01").isoformat() == (
        "2026-11-01T00:00:00+00:00"
    )
    assert outcomes.parse_instant("2026-11-01T10:00:00+02:00").isoformat() == (
        "2026-11-01T10:00:00+02:00"
    )
    with pytest.raises(ValueError, match="not an ISO 8601"):
        outcomes.parse_instant("last week")


# --------------------------------------------------------------------------- command


def outcomes_json(*args):
    out = StringIO()
    call_command("outcomes", "--json", *args, stdout=out)
    return orjson.loads(out.getvalue())


def test_command_prints_the_report_as_json_and_as_a_table():
    ran("e1", 10, 100)
    ran("c1", 40, 130, label="ci-go-svc", warmth="cold")
    body = outcomes_json()
    assert body["overall"]["exact"]["run_p50"] == 100
    assert body["pipelines"][0]["cold"]["startup_p50"] == 40
    assert outcomes_json("--label", "ci-java-app")["overall"]["cold"] == EMPTY
    future = (timezone.now() + timedelta(days=1)).date().isoformat()
    assert outcomes_json("--since", future)["pipelines"] == []
    out = StringIO()
    call_command("outcomes", stdout=out)
    text = out.getvalue()
    assert "(all pipelines)" in text and "ci-go-svc" in text
    assert "unknown: needs at least 5 successful exact" in text
    with pytest.raises(CommandError, match="--since: not an ISO 8601"):
        call_command("outcomes", "--since", "yesterday", stdout=StringIO())


# --------------------------------------------------------------------------- API


@pytest.fixture
def viewer_api():
    user = User.objects.create_user("viewer", password="s3cret-pass")
    user.groups.add(Group.objects.get(name="ks-scheduler viewers"))
    client = APIClient()
    client.force_login(user)
    return client


def test_api_serves_the_same_report(viewer_api):
    for i in range(5):
        ran(f"e{i}", 10, 100)
        ran(f"c{i}", 50, 160, warmth="cold")
    response = viewer_api.get("/api/outcomes/")
    assert response.status_code == 200
    body = response.json()
    until = outcomes.parse_instant(body["until"])
    assert body == outcomes.outcome_report(until=until)
    assert body["pipelines"][0]["saved_seconds"] == 500
    since = (timezone.now() - timedelta(days=1)).isoformat()
    filtered = viewer_api.get("/api/outcomes/", {"label": "other", "since": since})
    assert filtered.json()["pipelines"] == []
    assert filtered.json()["since"] == outcomes.parse_instant(since).isoformat()


def test_api_refuses_bad_input_and_unauthorised_users(viewer_api):
    response = viewer_api.get("/api/outcomes/", {"since": "yesterday"})
    assert response.status_code == 400
    assert "since" in response.json()
    assert APIClient().get("/api/outcomes/").status_code == 401
    nobody = APIClient()
    nobody.force_login(User.objects.create_user("nobody", password="x-long-pass"))
    assert nobody.get("/api/outcomes/").status_code == 403
    assert viewer_api.post("/api/outcomes/", {}).status_code == 405
    schema = viewer_api.get("/api/schema/", {"format": "json"}).json()
    params = {p["name"] for p in schema["paths"]["/api/outcomes/"]["get"]["parameters"]}
    assert params == {"label", "since"}
