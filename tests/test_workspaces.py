"""How long workspaces last: exact placements by depth and by age
(`history.workspaces`, `manage.py outcomes --workspaces`, the API), from the ledger
and through the real watcher."""

import random
from collections import OrderedDict
from datetime import timedelta
from io import StringIO

import orjson
import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from history.ledger import record_outcome, record_placement
from history.watcher import state
from history.workspaces import BEFORE_WINDOW, DEEPEST, NodeOrder, workspace_report
from tests.test_outcomes_watch import Cluster, catch_up, new_stream

pytestmark = pytest.mark.django_db

JAVA = "ci-java-app"


def test_a_depth_counts_the_other_pipelines_placed_on_that_node_since():
    order = NodeOrder()
    placed = [
        ("n1", "a"),
        ("n1", "b"),
        ("n2", "c"),  # another node: not between a's placements on n1
        ("n1", "c"),
        ("n1", "b"),  # b again: c ran since
        ("n1", "a"),  # b and c ran since (b twice counts once)
        ("n1", "a"),
    ]
    assert [order.place(node, label) for node, label in placed] == [
        None, None, None, None, 1, 2, 0,
    ]  # fmt: skip


def test_depths_past_the_deepest_are_not_told_apart_and_memory_stays_bounded():
    order = NodeOrder()
    order.place("n1", "a")
    order.place("n1", "b")
    for other in range(DEEPEST - 1):
        order.place("n1", f"x{other}")
    assert order.place("n1", "b") == DEEPEST - 1
    assert order.place("n1", "a") == DEEPEST  # the oldest the node remembers
    for other in range(DEEPEST + 5):
        order.place("n1", f"y{other}")
    assert order.place("n1", "a") == DEEPEST  # fell out of the recent order
    assert order.place("n1", "new") is None
    assert len(order.recent["n1"]) == DEEPEST + 1


class Ledger:
    """Placements written through the ledger, a minute apart (or `after` the one
    before), with their times."""

    def __init__(self):
        self.at = timezone.now() - timedelta(days=1)
        self.pods = 0

    def place(self, label, node, warmth, startup=None, after=timedelta(minutes=1)):
        self.pods += 1
        self.at += after
        uid = f"u{self.pods}"
        record_placement(
            pod_uid=uid,
            namespace="ci",
            name=f"pod-{self.pods}",
            label=label,
            node=node,
            bound_at=self.at,
            warmth=warmth,
        )
        if startup is not None:
            record_outcome(pod_uid=uid, startup=startup, run=100, outcome="Succeeded")


def by_depth(report):
    return {d["depth"]: (d["runs"], d["startup_p50"]) for d in report["depths"]}


def by_age(report):
    return {a["age"]: (a["runs"], a["startup_p50"]) for a in report["ages"]}


def evicting_cluster():
    """On n1 ci-java-app starts in 10 s straight after itself, 12 s after one other
    pipeline, 50 s after five (its workspace gone); cold placements take 60 s."""
    ledger = Ledger()
    ledger.place(JAVA, "n1", "exact", startup=30)  # ran there before the window
    for _ in range(5):
        ledger.place(JAVA, "n1", "exact", startup=10)
    for k in range(5):
        ledger.place(f"ci-go-one{k}", "n1", "cold")  # still running: no outcome
        ledger.place(JAVA, "n1", "exact", startup=12)
    for k in range(5):
        for j in range(5):
            ledger.place(f"ci-go-five{k}x{j}", "n1", "cold")
        ledger.place(JAVA, "n1", "exact", startup=50)
    for k in range(5):
        ledger.place("ci-rust-lib", f"c{k}", "cold", startup=60)
    ledger.place("ci-rust-lib", "c0", "partial", startup=40)


def test_the_report_finds_the_depth_where_exact_placements_start_like_cold_ones():
    evicting_cluster()
    report = workspace_report()
    assert by_depth(report) == {
        BEFORE_WINDOW: (1, 30),
        "0": (5, 10),
        "1": (5, 12),
        "2": (0, None),
        "3": (0, None),
        "4-7": (5, 50),
        "8-15": (0, None),
        "16+": (0, None),
    }
    assert (report["cold"]["runs"], report["cold"]["startup_p50"]) == (5, 60)
    assert (report["partial"]["runs"], report["partial"]["startup_p50"]) == (1, 40)
    assert (report["gone_from"], report["gone_reason"]) == (4, None)


def test_a_label_narrows_what_is_reported_but_every_pipeline_counts_in_the_depths():
    evicting_cluster()
    report = workspace_report(label=JAVA)
    assert by_depth(report)["1"] == (5, 12)
    assert by_depth(report)["4-7"] == (5, 50)
    assert report["cold"]["runs"] == 0  # ci-rust-lib is another pipeline
    assert report["gone_from"] is None
    assert report["gone_reason"] == (
        "needs at least 5 successful runs at depth 0 and 5 partial or cold; "
        "has 5 at depth 0, 0 partial and 0 cold"
    )


def test_no_depth_is_named_while_deep_placements_still_start_warm():
    ledger = Ledger()
    for _ in range(6):  # the first one: depth before the window
        ledger.place(JAVA, "n1", "exact", startup=10)
    for k in range(5):
        for j in range(9):
            ledger.place(f"ci-go-p{k}x{j}", "n1", "cold")
        ledger.place(JAVA, "n1", "exact", startup=20)  # 25 % of the cold penalty
    for k in range(5):
        ledger.place("ci-rust-lib", f"c{k}", "cold", startup=50)
    report = workspace_report()
    assert by_depth(report)["8-15"] == (5, 20)
    assert report["gone_from"] is None
    assert report["gone_reason"] == (
        "no depth with enough runs starts like the partial or cold ones"
    )


def test_the_command_prints_the_report_as_json_and_as_a_table():
    evicting_cluster()
    out = StringIO()
    call_command("outcomes", "--workspaces", "--json", stdout=out)
    printed = orjson.loads(out.getvalue())
    assert by_depth(printed) == by_depth(workspace_report())
    assert printed["gone_from"] == 4
    out = StringIO()
    call_command("outcomes", "--workspaces", stdout=out)
    table = out.getvalue()
    assert "depth 4-7" in table and "depth before the window" in table
    assert "From depth 4 on, exact placements start like cold ones" in table
    assert "workspaces last about 4 other pipelines" in table


@pytest.mark.django_db(transaction=True)
def test_depths_come_from_what_the_real_watcher_recorded(api, server):
    """Pods bound, started and ended through the fake API server and the real
    watcher: the watcher says which placements are exact, the ledger's order
    gives their depth."""
    start = timezone.now().replace(microsecond=0) - timedelta(hours=6)
    state.save_watch_state(name="pods", resource_version=server.resource_version)
    cluster = Cluster(server, start)
    cluster.run("a1", JAVA, "w1", 40, 100)  # cold: no history yet
    cluster.run("a2", JAVA, "w1", 10, 100)  # exact at depth 0
    cluster.run("b1", "ci-go-svc", "w1", 30, 100)
    cluster.run("c1", "ci-rust-lib", "w1", 30, 100)
    cluster.run("a3", JAVA, "w1", 25, 100)  # exact, two others since
    catch_up(new_stream(api), server)
    report = workspace_report()
    assert by_depth(report)["0"] == (1, 10)
    assert by_depth(report)["2"] == (1, 25)
    assert (report["cold"]["runs"], report["cold"]["startup_p50"]) == (1, 40)
    # Under the shared `ci` prefix of a pipeline that ran on w1 before.
    assert (report["partial"]["runs"], report["partial"]["startup_p50"]) == (2, 30)


def lru_cluster(slots, runs=400):
    """Nodes n1-n3 whose cache keeps the last `slots` pipelines' workspaces (each
    start 10-14 s when the workspace is there, 55-65 s when not), `runs` pods of
    12 pipelines drawn at random, written through the ledger with their outcomes."""
    rng = random.Random(slots)
    ledger = Ledger()
    caches = {node: OrderedDict() for node in ("n1", "n2", "n3")}
    pipelines = [f"ci-java-p{i}" for i in range(12)]
    ran_on = set()
    for _ in range(runs):
        node, label = rng.choice(list(caches)), rng.choice(pipelines)
        cache = caches[node]
        startup = rng.uniform(10, 14) if label in cache else rng.uniform(55, 65)
        warmth = "exact" if (node, label) in ran_on else "cold"
        ledger.place(label, node, warmth, startup=startup)
        ran_on.add((node, label))
        cache[label] = None
        cache.move_to_end(label)
        while len(cache) > slots:
            cache.popitem(last=False)


@pytest.mark.parametrize("slots", [2, 4])
def test_on_nodes_with_an_lru_cache_the_report_names_its_size(slots):
    """On an LRU cluster (`lru_cluster`), the report names `slots` as the depth
    where workspaces are gone."""
    lru_cluster(slots)
    report = workspace_report()
    assert (report["gone_from"], report["gone_reason"]) == (slots, None)


def test_the_api_serves_the_same_report_to_viewers_only():
    evicting_cluster()
    viewer = User.objects.create_user("viewer", password="x-long-password")
    viewer.groups.add(Group.objects.get(name="ks-scheduler viewers"))
    client = APIClient()
    client.force_login(viewer)
    body = client.get("/api/outcomes/workspaces/").json()
    assert by_depth(body) == by_depth(workspace_report())
    assert (body["gone_from"], body["gone_reason"]) == (4, None)
    narrowed = client.get("/api/outcomes/workspaces/", {"label": JAVA}).json()
    assert narrowed["cold"]["runs"] == 0
    assert client.get("/api/outcomes/workspaces/", {"since": "May"}).status_code == 400
    assert APIClient().get("/api/outcomes/workspaces/").status_code == 401
    nobody = APIClient()
    nobody.force_login(User.objects.create_user("nobody", password="x-long-pass"))
    assert nobody.get("/api/outcomes/workspaces/").status_code == 403
    schema = client.get("/api/schema/", {"format": "json"}).json()
    operation = schema["paths"]["/api/outcomes/workspaces/"]["get"]
    assert {p["name"] for p in operation["parameters"]} == {"label", "since"}
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer == {"$ref": "#/components/schemas/WorkspaceReport"}
    # The schema names every key the report answers with.
    fields = schema["components"]["schemas"]["WorkspaceReport"]["properties"]
    assert set(fields) == set(body)
    outcomes = schema["paths"]["/api/outcomes/"]["get"]["responses"]["200"]
    assert outcomes["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/OutcomeReport"
    }


def test_the_report_names_the_age_from_which_workspaces_look_gone():
    """ci-java-app back on n1 after 5 minutes starts in 10 s, after 2 hours in 12 s,
    after 2 days in 55 s (cold: 60 s): workspaces survive about a day."""
    ledger = Ledger()
    ledger.at = timezone.now() - timedelta(days=20)
    ledger.place(JAVA, "n1", "exact", startup=30)  # before the window
    for after, startup in ((timedelta(minutes=5), 10), (timedelta(hours=2), 12)):
        for _ in range(5):
            ledger.place(JAVA, "n1", "exact", startup=startup, after=after)
    for _ in range(5):
        ledger.place(JAVA, "n1", "exact", startup=55, after=timedelta(days=2))
    for k in range(5):
        ledger.place("ci-rust-lib", f"c{k}", "cold", startup=60)
    report = workspace_report()
    assert by_age(report) == {
        BEFORE_WINDOW: (1, 30),
        "0-10 min": (5, 10),
        "10 min-1 h": (0, None),
        "1 h-6 h": (5, 12),
        "6 h-1 d": (0, None),
        "1 d-3 d": (5, 55),
        "3 d-7 d": (0, None),
        "7 d+": (0, None),
    }
    assert (report["gone_after"], report["gone_after_reason"]) == (86400, None)
    assert by_depth(report)["0"] == (15, 12)  # one pipeline on n1: always depth 0
    assert report["gone_from"] is None
    out = StringIO()
    call_command("outcomes", "--workspaces", "--since", "2026-01-01", stdout=out)
    assert "From an age of 1 d on, they start like cold too." in out.getvalue()
