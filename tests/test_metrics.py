"""/metrics: extender latency, nodes, scores and errors; watcher and ledger state from
the database; several gunicorn workers add up through the multiprocess directory."""

import http.client
import json
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from history.ledger import increment_key_nodes
from history.models import Placement, WatchState
from history.worth_feed import process_worth
from history.worth_samples import MIN_RUNS
from tests.helpers import free_port, load_fixture, run_gunicorn, succeeded

PRIORITIZE = "/scheduler/priorities/pipeline"
FILTER = "/scheduler/predicates/alwaystrue"


def parse(text: str) -> dict:
    """{(sample name, sorted label items): value} for every sample."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(client=None) -> dict:
    response = (client or Client()).get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse(response.content.decode())


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before, after, name, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.mark.django_db
def test_prioritize_latency_nodes_and_scores_are_measured():
    increment_key_nodes(keys=["pipeline1"], node="worker-1")
    before = scrape()
    response = Client().post(
        PRIORITIZE,
        load_fixture("prioritize-nodenames.json"),
        content_type="application/json",
    )
    assert response.status_code == 200
    after = scrape()

    verb = "priorities/pipeline"
    hist = "kssched_extender_request_seconds"
    assert delta(before, after, f"{hist}_count", verb=verb) == 1
    assert 0 < delta(before, after, f"{hist}_sum", verb=verb) < 5
    # The fastest bucket that holds the request and every bucket above it grew by one.
    assert delta(before, after, f"{hist}_bucket", verb=verb, le="+Inf") == 1
    assert delta(before, after, f"{hist}_bucket", verb=verb, le="5.0") == 1

    nodes = "kssched_extender_request_nodes"
    assert delta(before, after, f"{nodes}_count", verb=verb) == 1
    assert delta(before, after, f"{nodes}_sum", verb=verb) == len(response.json())

    returned = Counter(entry["Score"] for entry in response.json())
    assert len(returned) == 2  # a warm node and a cold one
    for score in range(11):
        assert delta(
            before, after, "kssched_extender_scores_total", score=str(score)
        ) == returned.get(score, 0)


@pytest.mark.django_db
def test_filter_counts_the_nodes_it_passes():
    body = load_fixture("filter-nodes.json")
    expected = len(json.loads(body)["Nodes"]["items"])
    before = scrape()
    response = Client().post(FILTER, body, content_type="application/json")
    assert response.status_code == 200
    after = scrape()
    verb = "predicates/alwaystrue"
    assert delta(before, after, "kssched_extender_request_nodes_sum", verb=verb) == (
        expected
    )
    assert (
        delta(before, after, "kssched_extender_request_seconds_count", verb=verb) == 1
    )
    # Filter answers carry no scores.
    assert all(
        delta(before, after, "kssched_extender_scores_total", score=str(s)) == 0
        for s in range(11)
    )


@pytest.mark.django_db
def test_errors_are_counted_by_verb_and_reason():
    client = Client()
    before = scrape()
    assert (
        client.post(PRIORITIZE, b"{not json", content_type="application/json")
    ).status_code == 400
    assert client.get(PRIORITIZE).status_code == 405
    assert (
        Client(REMOTE_ADDR="192.0.2.10").post(
            PRIORITIZE,
            load_fixture("prioritize-nodenames.json"),
            content_type="application/json",
        )
    ).status_code == 403
    assert client.post("/scheduler/no-such-verb").status_code == 404
    after = scrape()

    errors = "kssched_extender_errors_total"
    verb = "priorities/pipeline"
    assert delta(before, after, errors, verb=verb, reason="bad_request") == 1
    assert delta(before, after, errors, verb=verb, reason="method_not_allowed") == 1
    assert delta(before, after, errors, verb=verb, reason="forbidden") == 1
    # Unknown paths share one series, so they cannot multiply the series.
    assert delta(before, after, errors, verb="unknown", reason="not_found") == 1
    assert not any("no-such-verb" in str(labels) for _name, labels in after if labels)


@pytest.mark.django_db
def test_watcher_and_ledger_state_are_read_from_the_database():
    now = timezone.now()
    WatchState.objects.create(
        name="pods",
        resource_version="4711",
        events=42,
        relists=3,
        last_event_at=now - timedelta(seconds=30),
        heartbeat_at=now - timedelta(seconds=5),
        skipped_events=1,
    )
    for number, (warmth, finished) in enumerate(
        [("exact", None), ("exact", now), ("partial", None), ("cold", None)]
    ):
        Placement.objects.create(
            pod_uid=f"uid-{number}",
            namespace="ks-pipelines",
            name=f"pod-{number}",
            label="pipeline1-extract",
            node="worker-1",
            bound_at=now - timedelta(minutes=5),
            finished_at=finished,
            warmth=warmth,
        )

    samples = scrape()
    assert value(samples, "kssched_database_up") == 1
    assert value(samples, "kssched_watch_events_total", stream="pods") == 42
    assert value(samples, "kssched_watch_relists_total", stream="pods") == 3
    assert value(samples, "kssched_watch_events_skipped_total", stream="pods") == 1
    age = value(samples, "kssched_watch_last_event_age_seconds", stream="pods")
    assert 30 <= age < 60
    staleness = value(samples, "kssched_counts_staleness_seconds", stream="pods")
    assert 5 <= staleness < 30
    assert value(samples, "kssched_placements_total") == 4
    assert value(samples, "kssched_placements_active") == 3
    assert value(samples, "kssched_placements_warmth_total", warmth="exact") == 2
    assert value(samples, "kssched_placements_warmth_total", warmth="partial") == 1
    assert value(samples, "kssched_placements_warmth_total", warmth="cold") == 1


@pytest.mark.django_db
def test_pipelines_are_counted_by_worth_band(settings, warm):
    bands = ("off", "weaker", "default", "stronger")
    samples = scrape()
    # Always the four bands, no other series; no outcomes yet: none in any.
    assert {
        labels for name, labels in samples if name == "kssched_pipeline_worth_pipelines"
    } == {(("band", band),) for band in bands}
    assert value(samples, "kssched_pipeline_worth_applied") == 1
    # Three pipelines that gain what a typical one does, one that gains nothing.
    for n in range(3):
        for i in range(MIN_RUNS):
            succeeded(f"t{n}-e{i}", f"ci-java-t{n}", "exact", 10.0 + i % 3, 100.0)
            succeeded(f"t{n}-c{i}", f"ci-java-t{n}", "cold", 70.0 + i % 3, 100.0)
    for i in range(MIN_RUNS):
        succeeded(f"flat-e{i}", "ci-java-flat", "exact", 10.0 + i % 4, 100.0)
        succeeded(f"flat-c{i}", "ci-java-flat", "cold", 11.0 - i % 4, 100.0)
    # The book reads the ledger again once KSSCHED_WORTH_REFRESH_SECONDS passed.
    process_worth().next_refresh = 0.0
    samples = scrape()
    counts = {
        band: value(samples, "kssched_pipeline_worth_pipelines", band=band)
        for band in bands
    }
    assert counts == {"off": 1, "weaker": 0, "default": 3, "stronger": 0}
    # Off: the learned bands still show (what auto would do), marked not applied.
    settings.KSSCHED_WORTH = "off"
    samples = scrape()
    assert value(samples, "kssched_pipeline_worth_applied") == 0
    assert value(samples, "kssched_pipeline_worth_pipelines", band="off") == 1


@pytest.mark.django_db
def test_the_workspace_depth_in_use_is_a_gauge(settings):
    from history.models import LearnedDepth

    assert value(scrape(), "kssched_workspace_depth") == 0
    settings.KSSCHED_WORKSPACE_DEPTH = 4
    assert value(scrape(), "kssched_workspace_depth") == 4
    settings.KSSCHED_WORKSPACE_DEPTH = "auto"
    LearnedDepth.objects.create(depth=3, measured_at=timezone.now())
    assert value(scrape(), "kssched_workspace_depth") == 3


@pytest.mark.django_db
def test_metrics_token_is_required_when_set(settings):
    settings.KSSCHED_METRICS_TOKEN = "scrape-token-1"
    client = Client()
    assert client.get("/metrics").status_code == 401
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer other")
    assert wrong.status_code == 401
    right = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-1")
    assert right.status_code == 200
    assert b"kssched_extender_request_seconds" in right.content


# --- Against the real gunicorn ------------------------------------------------------


def request(url, method, path, body=None):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(
            method,
            path,
            body=body,
            headers={"Content-Type": "application/json", "Host": "localhost"},
        )
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.django_db(transaction=True)
def test_two_workers_add_up_in_multiprocess_mode(tmp_path):
    directory = tmp_path / "prometheus"
    directory.mkdir()
    stale = directory / "counter_999999.db"
    stale.write_bytes(b"left over from the previous start")
    body = load_fixture("prioritize-nodenames.json")
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory)}

    with run_gunicorn(env, workers=2) as (url, process):
        assert not stale.exists(), "gunicorn must empty the directory at start"
        sent = 0
        pids: set[str] = set()
        with ThreadPoolExecutor(max_workers=4) as pool:
            # Keep both workers busy until each has answered at least once.
            while len(pids) < 2 and sent < 400:
                statuses = list(
                    pool.map(
                        lambda _: request(url, "POST", PRIORITIZE, body)[0], range(8)
                    )
                )
                assert statuses == [200] * 8
                sent += 8
                pids = {
                    re.search(r"_(\d+)\.db$", path.name).group(1)
                    for path in directory.glob("histogram_*.db")
                }
        assert len(pids) == 2, f"one worker answered all {sent} requests"
        assert str(process.pid) not in pids

        # Whichever worker answers the scrape, the totals are those of both.
        for _ in range(4):
            status, text = request(url, "GET", "/metrics")
            assert status == 200
            samples = parse(text.decode())
            count = value(
                samples,
                "kssched_extender_request_seconds_count",
                verb="priorities/pipeline",
            )
            assert count == sent
            nodes = value(
                samples,
                "kssched_extender_request_nodes_sum",
                verb="priorities/pipeline",
            )
            assert nodes == 2 * sent


@pytest.mark.django_db(transaction=True)
def test_metrics_answer_with_database_up_zero_when_the_database_is_gone():
    env = {"DATABASE_URL": f"postgres://ks@127.0.0.1:{free_port()}/ks"}
    body = load_fixture("prioritize-nodenames.json")
    with run_gunicorn(env, workers=1) as (url, _process):
        call_status, answer = request(url, "POST", PRIORITIZE, body)
        status, text = request(url, "GET", "/metrics")
    assert status == 200
    samples = parse(text.decode())
    assert value(samples, "kssched_database_up") == 0
    assert not any(name.startswith("kssched_placements") for name, _ in samples)
    errors = value(
        samples,
        "kssched_extender_errors_total",
        verb="priorities/pipeline",
        reason="database_error",
    )
    if call_status == 200:
        # All-zero scores are the other answer the scheduler accepts without a database.
        assert {entry["Score"] for entry in json.loads(answer)} == {0}
        assert errors == 0
    else:
        assert call_status == 503
        assert json.loads(answer)["Error"].startswith("history unavailable: ")
        assert errors == 1


@pytest.mark.parametrize(
    "scores",
    [[], [0, 10, 10, 1], [1] * 1000, [3, 42, 3], [-1, 2], [2.0, 2], [True, 1]],
)
def test_score_tally_counts_every_score(scores):
    from kssched.metrics import _tally

    assert _tally(scores) == dict(Counter(scores))
