"""Outcomes end to end: pods with realistic container statuses go through the fake
API server to the real watcher, then out of `outcomes --json`, the API and the admin.

Between phases the watcher is restarted, replayed from an old resourceVersion and
made to relist; the figures must stay exactly what the pods' own times give.
"""

from datetime import timedelta
from io import StringIO

import orjson
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from history.corrections import create_key_node
from history.models import Placement
from history.watcher import metrics, state
from history.watcher.loop import Stream
from history.watcher.options import Options
from history.watcher.pods import PodHandler
from tests.fakeapi import (
    ClusterWatch,
    make_pod,
    pod_status,
)

pytestmark = pytest.mark.django_db(transaction=True)

JAVA = "ci-java-app"
GO = "ci-go-svc"


@pytest.fixture
def bookmark_interval():
    return None


@pytest.fixture
def read_timeout():
    return 2.0


def new_stream(api):
    options = Options(
        scheduler_name="ks-scheduler",
        pipeline_label="ks-pipeline",
        server_timeout=(5, 6),
        backoff_base=0.05,
        backoff_cap=0.3,
    )
    stream = Stream(api, PodHandler(options), options=options)
    stream.start()
    return stream


def catch_up(stream, server):
    """One watch that delivers every pod event after the stream's checkpoint."""
    after = int(stream.resource_version or 0)
    pending = [
        e
        for e in server.events("pods")
        if int(e["object"]["metadata"]["resourceVersion"]) > after
    ]
    server.inject(ClusterWatch(max_events=len(pending), end="close"))
    stream.watch_once()
    assert stream.resource_version == server.resource_version


class Cluster:
    """Drives pods through binding, pulling, running and ending, as the kubelet
    reports them; every pod is bound `spacing` after the previous one."""

    def __init__(self, server, start):
        self.server = server
        self.next_bind = start

    def submit(self, name, label, node):
        self.server.add_pod(make_pod(name, uid=f"u-{name}", label=label))
        scheduled = self.next_bind
        self.next_bind += timedelta(minutes=10)
        self.report(name, node, scheduled=scheduled)
        return scheduled

    def report(self, name, node, **status):
        def change(pod):
            pod["spec"]["nodeName"] = node
            pod["status"] = pod_status(**status)

        self.server.modify_pod(name, change)

    def run(self, name, label, node, startup, run=None, exit_code=0, end=True):
        """Bind, start after `startup` s, end after `run` more seconds (if `end`)."""
        at = self.submit(name, label, node)
        started = at + timedelta(seconds=startup)
        self.report(name, node, scheduled=at, started=started)
        if end:
            finished = started + timedelta(seconds=run)
            self.report(
                name,
                node,
                scheduled=at,
                started=started,
                finished=finished,
                exit_code=exit_code,
            )
        return at, started


def samples():
    read = metrics.REGISTRY.get_sample_value
    values = {}
    for warmth in ("exact", "partial", "cold"):
        for name in ("startup", "run"):
            key = f"kssched_pipeline_{name}_seconds"
            values[(name, warmth)] = (
                read(f"{key}_count", {"warmth": warmth}),
                read(f"{key}_sum", {"warmth": warmth}),
            )
    for reason in ("missing_time", "negative_startup", "end_before_start"):
        values[reason] = read(
            "kssched_pipeline_timings_unusable_total", {"reason": reason}
        )
    return values


def figures(runs, failed, startups, run_times):
    """S for sorted lists of startup and run seconds (p50, p90 worked out by hand)."""
    return {
        "runs": runs,
        "failed": failed,
        "startup_p50": startups[0],
        "startup_p90": startups[1],
        "run_p50": run_times[0],
        "run_p90": run_times[1],
    }


EXACT = figures(5, 1, (14, 18), (120, 140))
PARTIAL = figures(1, 0, (30, 30), (200, 200))
JAVA_COLD = figures(5, 1, (80, 100), (340, 380))
GO_COLD = figures(1, 0, (25, 25), (90, 90))
EMPTY = figures(0, 0, (None, None), (None, None))
# Overall cold: startups 25 60 70 80 90 100, runs 90 300 320 340 360 380.
ALL_COLD = figures(6, 1, (75, 100), (330, 380))
# Medians of startup+run: exact 110 122 134 146 158 -> 134; cold 360..480 -> 420.
SAVED = (420 - 134) * 5


def test_watched_pods_give_exact_outcomes_through_restarts_replays_and_relists(
    api, server
):
    # warm-1 ran this very pipeline; part-1 one under the same ci-java prefix.
    create_key_node(key=f"{JAVA}$", node="warm-1", count=3, actor="test")
    create_key_node(key="ci-java-*", node="part-1", count=3, actor="test")
    before = samples()
    start = timezone.now().replace(microsecond=0) - timedelta(hours=12)
    cluster = Cluster(server, start)
    checkpoint = server.resource_version
    state.save_watch_state(name="pods", resource_version=checkpoint)

    # Phase 1: three exact runs, two cold, one exact still running.
    for i, (startup, run) in enumerate([(10, 100), (12, 110), (14, 120)]):
        cluster.run(f"e{i}", JAVA, "warm-1", startup, run)
    for i, (startup, run) in enumerate([(60, 300), (70, 320)]):
        cluster.run(f"c{i}", JAVA, f"cold-{i}", startup, run)
    e3_bound, e3_started = cluster.run("e3", JAVA, "warm-1", 16, end=False)
    stream = new_stream(api)
    catch_up(stream, server)
    assert Placement.objects.get(pod_uid="u-e3").startup_seconds == 16

    # Phase 2, after a watcher restart.
    cluster.report(
        "e3",
        "warm-1",
        scheduled=e3_bound,
        started=e3_started,
        finished=e3_started + timedelta(seconds=130),
    )
    for i, (startup, run) in enumerate([(80, 340), (90, 360), (100, 380)], start=2):
        cluster.run(f"c{i}", JAVA, f"cold-{i}", startup, run)
    # The container fails once and is restarted: run counts from the first start.
    at, first = cluster.run("e4", JAVA, "warm-1", 18, end=False)
    again = at + timedelta(seconds=50)
    restarted = (first, at + timedelta(seconds=40))
    cluster.report("e4", "warm-1", scheduled=at, started=again, restarted=restarted)
    cluster.report(
        "e4",
        "warm-1",
        scheduled=at,
        started=again,
        restarted=restarted,
        finished=at + timedelta(seconds=158),
    )
    cluster.run("e-fail", JAVA, "warm-1", 8, 30, exit_code=1)
    cluster.run("p1", JAVA, "part-1", 30, 200)
    cluster.run("g1", GO, "cold-go", 25, 90)
    # Unusable: the kubelet's clock behind the control plane's; the end before
    # the start; failed before any container started (image never pulled).
    cluster.run("e-skew", JAVA, "warm-1", -3, 100)
    cluster.run("c-bad", JAVA, "cold-bad", 40, -20)
    at = cluster.submit("c-missing", JAVA, "cold-missing")
    cluster.report(
        "c-missing", "cold-missing", scheduled=at, finished=at, phase="Failed"
    )
    # Deleted while running: a startup, but no run and no outcome.
    cluster.run("c-del", JAVA, "cold-del", 45, end=False)
    server.delete_pod("c-del")
    catch_up(new_stream(api), server)
    first_pass = report_json()
    assert_expected(first_pass)

    # Replayed from the first checkpoint: every event again, nothing changes.
    state.save_watch_state(name="pods", resource_version=checkpoint)
    catch_up(new_stream(api), server)
    # Away longer than the API server keeps history: 410, relist, nothing changes.
    state.save_watch_state(name="pods", resource_version=checkpoint)
    server.compact()
    relisted = new_stream(api)
    assert relisted.watch_once() is False
    server.inject(ClusterWatch(max_events=0, end="close"))
    relisted.watch_once()
    assert relisted.resource_version == server.resource_version
    again_report = report_json()
    assert again_report["pipelines"] == first_pass["pipelines"]
    assert again_report["overall"] == first_pass["overall"]

    row = Placement.objects.get(pod_uid="u-c-del")
    assert (row.startup_seconds, row.run_seconds, row.outcome) == (45, None, "")
    assert row.finished_at is not None

    after = samples()
    count = {key: after[key][0] - before[key][0] for key in after if key[0] == "run"}
    assert count == {("run", "exact"): 5, ("run", "partial"): 1, ("run", "cold"): 6}
    assert after[("startup", "exact")][1] - before[("startup", "exact")][1] == 70
    assert after[("run", "cold")][1] - before[("run", "cold")][1] == 1790
    unusable = {
        reason: after[reason] - before[reason]
        for reason in ("missing_time", "negative_startup", "end_before_start")
    }
    assert unusable == {"missing_time": 1, "negative_startup": 1, "end_before_start": 1}

    # The same figures from the API and on the admin pipeline page.
    admin = User.objects.create_superuser("admin", "a@example.com", "pw-long-enough")
    client = APIClient()
    client.force_login(admin)
    api_body = client.get("/api/outcomes/").json()
    assert api_body["overall"] == first_pass["overall"]
    assert api_body["pipelines"] == first_pass["pipelines"]
    page = client.get("/admin/pipeline/", {"q": JAVA}).content.decode()
    assert 'data-warmth="exact" data-measure="startup" data-p50="14"' in page
    assert 'data-warmth="cold" data-measure="run" data-p50="340"' in page
    assert 'id="outcomes-saved">' in page and "23 min 50 s" in page


def report_json(*args):
    out = StringIO()
    call_command("outcomes", "--json", *args, stdout=out)
    return orjson.loads(out.getvalue())


def assert_expected(report):
    assert report["overall"] == {"exact": EXACT, "partial": PARTIAL, "cold": ALL_COLD}
    assert report["pipelines"] == [
        {
            "label": GO,
            "exact": EMPTY,
            "partial": EMPTY,
            "cold": GO_COLD,
            "saved_seconds": None,
            "saved_reason": "needs at least 5 successful exact and 5 cold runs; "
            "has 0 exact and 1 cold",
        },
        {
            "label": JAVA,
            "exact": EXACT,
            "partial": PARTIAL,
            "cold": JAVA_COLD,
            "saved_seconds": SAVED,
            "saved_reason": None,
        },
    ]
    assert report_json("--label", GO)["pipelines"] == [report["pipelines"][0]]
