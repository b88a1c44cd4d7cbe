"""Kubernetes Events on pipeline pods, written by the real `watch_pods` through the
unmodified `kubernetes` client to the test API server, which validates and keeps
them as the API server does."""

import logging

import pytest
from django.utils import timezone

from history.models import LearnedDepth, Placement
from history.reader.depths import DEEPEST
from history.watcher import metrics
from history.watcher.placement_events import PlacementEvent, TokenBucket, event_name
from tests.fakeapi import FakeApiServer, StatusAction, make_pod
from tests.helpers import place, watch_once
from tests.test_settings import run_manage

pytestmark = pytest.mark.django_db(transaction=True)

LABEL = "jenkins-java-maven-myapp"


@pytest.fixture
def server():
    with FakeApiServer(bookmark_interval=0.3) as fake:
        yield fake


def three_placements(server):
    """History making n1 exact, n2 partial and n3 cold for LABEL; a pod on each."""
    place("old-1", LABEL, "n1")
    place("old-2", LABEL, "n1")
    place("old-3", "jenkins-java-gradle-other", "n2")
    for name, node in (("exact", "n1"), ("partial", "n2"), ("cold", "n3")):
        server.add_pod(make_pod(f"build-{name}", label=LABEL, node=node))


def event_requests(server):
    return [r for r in server.requests if r.resource == "events"]


def result_count(result):
    return metrics.PLACEMENT_EVENTS.labels(result)._value.get()


def test_an_event_says_where_the_pod_landed_and_why(server, tmp_path):
    three_placements(server)
    watch_once(server, tmp_path)
    events = {e["regarding"]["name"]: e for e in server.objects("events")}
    assert set(events) == {"build-exact", "build-partial", "build-cold"}
    notes = {name: event["note"] for name, event in events.items()}
    # The keys of its label path, which warmth is judged by (labels.path_keys):
    # n2 ran jenkins-java-gradle-other, under two of its prefixes.
    assert notes == {
        "build-exact": f"Placed on n1: exact (pipeline {LABEL}); pipeline pods "
        "before it on n1 by key: jenkins-* 2, jenkins-java-* 2, "
        f"jenkins-java-maven-* 2, {LABEL}$ 2",
        "build-partial": f"Placed on n2: partial (pipeline {LABEL}); pipeline pods "
        "before it on n2 by key: jenkins-* 1, jenkins-java-* 1; none for "
        f"jenkins-java-maven-*, {LABEL}$",
        "build-cold": f"Placed on n3: cold (pipeline {LABEL}); no history of its "
        "keys on n3",
    }
    reasons = {name: event["reason"] for name, event in events.items()}
    assert reasons == {
        "build-exact": "WarmPlacement",
        "build-partial": "PartialPlacement",
        "build-cold": "ColdPlacement",
    }
    for name, event in events.items():
        pod = server.get("pods", name)
        assert event["apiVersion"] == "events.k8s.io/v1"
        assert event["type"] == "Normal"
        assert event["action"] == "Placed"
        assert event["reportingController"] == "ks-scheduler-watcher"
        assert event["reportingInstance"]
        assert event["metadata"]["namespace"] == pod["metadata"]["namespace"]
        assert event["regarding"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod["metadata"]["namespace"],
            "name": name,
            "uid": pod["metadata"]["uid"],
        }
        # The reason follows what the ledger recorded.
        warmth = Placement.objects.get(pod_uid=pod["metadata"]["uid"]).warmth
        assert event["note"].startswith(
            f"Placed on {pod['spec']['nodeName']}: {warmth}"
        )


def test_a_pod_already_in_the_ledger_gets_no_second_event(server, tmp_path):
    three_placements(server)
    watch_once(server, tmp_path)
    assert len(server.objects("events")) == 3
    server.compact()  # the next pass relists every pod
    watch_once(server, tmp_path)
    assert len(server.objects("events")) == 3
    assert len(event_requests(server)) == 3


def test_without_rbac_one_log_line_one_count_and_nothing_more(server, tmp_path, caplog):
    server.inject(
        StatusAction(403, "Forbidden", 'events.events.k8s.io is forbidden: User "x"'),
        times=100,
        verb="create",
        resource="events",
    )
    three_placements(server)
    forbidden = result_count("forbidden")
    with caplog.at_level(logging.WARNING, logger="history.watcher"):
        watch_once(server, tmp_path)
    assert len(event_requests(server)) == 1
    assert result_count("forbidden") == forbidden + 1
    lines = [r for r in caplog.records if "placement Events" in r.getMessage()]
    assert len(lines) == 1
    assert "403" in lines[0].getMessage()
    # The placements themselves are recorded.
    assert Placement.objects.filter(name__startswith="build-").count() == 3


def test_events_can_be_turned_off(server, tmp_path):
    three_placements(server)
    watch_once(server, tmp_path, KSSCHED_PLACEMENT_EVENTS=False)
    assert event_requests(server) == []
    assert Placement.objects.filter(name__startswith="build-").count() == 3


def test_events_beyond_the_rate_are_dropped_and_counted(server, tmp_path):
    for number in range(5):
        server.add_pod(make_pod(f"build-{number}", label=LABEL, node="n1"))
    dropped = result_count("dropped")
    watch_once(
        server,
        tmp_path,
        KSSCHED_PLACEMENT_EVENTS_PER_SECOND=0.001,
        KSSCHED_PLACEMENT_EVENTS_BURST=2,
    )
    assert len(server.objects("events")) == 2
    assert result_count("dropped") == dropped + 3


def test_token_bucket_allows_the_burst_then_the_rate():
    now = [0.0]
    bucket = TokenBucket(rate=2.0, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] += 0.5  # one token back at 2 a second
    assert [bucket.take(), bucket.take()] == [True, False]
    now[0] += 100  # never more than the burst saved up
    assert sum(bucket.take() for _ in range(10)) == 3
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1)


def test_a_bad_event_rate_is_refused_at_startup(tmp_path):
    result = run_manage(
        ["check"],
        {
            "SECRET_KEY": "x" * 50,
            "DATA_PATH": str(tmp_path / "db.sqlite3"),
            "KSSCHED_PLACEMENT_EVENTS_PER_SECOND": "0",
        },
    )
    assert result.returncode != 0
    assert "KSSCHED_PLACEMENT_EVENTS_PER_SECOND" in result.stderr


def test_long_pod_names_give_event_names_the_api_server_accepts(server, tmp_path):
    # Pod names up to 253 characters are valid; `{pod}.{time_ns:x}` was 270.
    head = "build-" + "x" * 220 + "-"  # the cut falls just after the "-"
    names = [head + "a" * (253 - len(head)), head + "b" * (253 - len(head))]
    for name in names:
        server.add_pod(make_pod(name, label=LABEL, node="n1"))
    watch_once(server, tmp_path)
    events = server.objects("events")
    assert sorted(e["regarding"]["name"] for e in events) == names
    event_names = [e["metadata"]["name"] for e in events]
    assert len(set(event_names)) == 2
    assert all(len(name) <= 253 for name in event_names)


def test_event_names_stay_unique_within_the_limit():
    short = event_name("build-1", 0x1234)
    assert short == "build-1.1234"
    long_a, long_b = ("p" * 240 + "-" + tail for tail in ("a" * 12, "b" * 12))
    first, second = event_name(long_a, 2**62), event_name(long_b, 2**62)
    assert first != second
    assert len(first) == len(second) == 253
    assert first.startswith("p" * 200)
    assert "-." not in first and ".." not in first


@pytest.mark.parametrize(
    "depth, gone",
    [(0, None), (4, False), (2, True), ("auto", True)],
    ids=["off", "deeper-than-2", "gone-from-2", "auto-measured-2"],
)
def test_with_a_workspace_depth_an_exact_placement_says_how_deep_its_workspace_was(
    server, tmp_path, depth, gone
):
    """Two other pipelines ran on n1 since LABEL did: with KSSCHED_WORKSPACE_DEPTH
    on, the Event of LABEL's next pod there says so, and whether `warm` counted
    the workspace as gone; a cold placement says nothing of it."""
    LearnedDepth.objects.create(pk=1, depth=2, measured_at=timezone.now())
    place("old-a", LABEL, "n1")
    place("old-b", "gitlab-go-build-web", "n1")
    place("old-c", "tekton-node-npm-ui", "n1")
    server.add_pod(make_pod("build-again", label=LABEL, node="n1"))
    server.add_pod(make_pod("build-cold", label=LABEL, node="n2"))
    watch_once(server, tmp_path, KSSCHED_WORKSPACE_DEPTH=depth)
    notes = {e["regarding"]["name"]: e["note"] for e in server.objects("events")}
    assert "workspace" not in notes["build-cold"]
    if gone is None:
        assert "workspace" not in notes["build-again"]
        return
    says = "its workspace: 2 other pipelines placed on n1 since it last was"
    if gone:
        says += ", so it counts as gone (depth 2)"
    assert notes["build-again"].endswith(f"; {says}")


def exact_on_n1(**workspace):
    """The Event of an exact placement of LABEL on n1, with `workspace`'s depth."""
    return PlacementEvent(
        namespace="ci",
        pod="p",
        uid="u",
        label=LABEL,
        node="n1",
        warmth="exact",
        keys=(f"{LABEL}$",),
        history=((f"{LABEL}$", 3),),
        **workspace,
    )


@pytest.mark.parametrize(
    "depth, others",
    [(0, "no other pipeline"), (1, "1 other pipeline"), (3, "3 other pipelines")],
)
def test_the_workspace_line_counts_the_other_pipelines(depth, others):
    assert exact_on_n1(depth=depth).note.endswith(
        f"; its workspace: {others} placed on n1 since it last was"
    )


def test_a_workspace_as_deep_as_the_readers_tell_is_that_deep_or_more():
    assert exact_on_n1(depth=DEEPEST, gone_from=4).note.endswith(
        f"; its workspace: {DEEPEST} or more other pipelines placed on n1 since it "
        "last was, so it counts as gone (depth 4)"
    )
