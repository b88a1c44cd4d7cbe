"""Admin: login required, counts editable and recorded."""

import csv
import io
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from xml.etree import ElementTree

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

from extender.scoring.strategies import get_strategy
from history.audit import audit_counts
from history.corrections import create_key_node
from history.labels import placement_keys
from history.models import (
    MAX_COUNT,
    CountAdjustment,
    KeyNode,
    LearnedDepth,
    NodeRecord,
    Placement,
    WatchState,
)
from tests.helpers import log_in, place

pytestmark = pytest.mark.django_db


def test_admin_requires_login(client):
    response = client.get("/admin/history/keynode/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_admin_login_with_the_form(client):
    User.objects.create_superuser("admin", "admin@example.com", "s3cret-pass")
    response = client.post(
        "/admin/login/?next=/admin/",
        {"username": "admin", "password": "s3cret-pass", "next": "/admin/"},
    )
    assert response.status_code == 302
    assert response["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200


# --- Login throttling -----------------------------------------------------------------

ATTACKER = "192.0.2.10"


def login_attempt(password, *, username="admin", address=ATTACKER):
    """One post of the login form from `address`, by a fresh browser."""
    return Client(REMOTE_ADDR=address).post(
        "/admin/login/",
        {"username": username, "password": password, "next": "/admin/"},
    )


def lock_out_admin():
    """Five wrong passwords for "admin" from ATTACKER: the fifth is locked out."""
    User.objects.create_superuser("admin", "admin@example.com", "s3cret-pass")
    for _ in range(4):
        response = login_attempt("wrong-guess")
        assert response.status_code == 200
        assert b"Please enter the correct username and password" in response.content
    response = login_attempt("wrong-guess")
    assert response.status_code == 429
    return response


def test_login_is_locked_after_five_failures_even_for_the_right_password():
    locked = lock_out_admin()
    assert (
        b'Too many failed logins for "admin" from your address: logins for this user '
        b"from here are refused for 15 min, even with the right password."
    ) in locked.content
    assert b"axes_reset_username admin" in locked.content
    right = login_attempt("s3cret-pass")
    assert right.status_code == 429
    assert "_auth_user_id" not in right.client.session
    # The lock holds one username from one address, not the user everywhere, nor
    # every user of that address.
    User.objects.create_superuser("ops", "ops@example.com", "other-pass-42")
    assert login_attempt("s3cret-pass", address="192.0.2.11").status_code == 302
    assert login_attempt("other-pass-42", username="ops").status_code == 302


def test_axes_reset_username_unlocks_at_once():
    lock_out_admin()
    out = io.StringIO()
    call_command("axes_reset_username", "admin", stdout=out)
    assert "1 attempts removed" in out.getvalue()
    assert login_attempt("s3cret-pass").status_code == 302


def test_a_lockout_ends_after_the_cooloff(settings):
    # Long enough that the five failures (each a password hash) count together on
    # a busy machine: each failure restarts the window until the lockout.
    settings.AXES_COOLOFF_TIME = timedelta(seconds=3)
    lock_out_admin()
    assert login_attempt("s3cret-pass").status_code == 429
    time.sleep(3.2)
    assert login_attempt("s3cret-pass").status_code == 302


def test_keynode_list_and_search(admin_client):
    KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    KeyNode.objects.create(key="gitlab", node="worker-2", count=4)
    response = admin_client.get("/admin/history/keynode/", {"q": "jenkins"})
    assert response.status_code == 200
    shown = [(row.key, row.node) for row in response.context["cl"].result_list]
    assert shown == [("jenkins", "worker-1")]


def test_admin_count_edit_is_saved_and_recorded(admin_client):
    row = KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    response = admin_client.post(
        f"/admin/history/keynode/{row.pk}/change/", {"count": "12"}
    )
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.count == 12
    adjustment = CountAdjustment.objects.get()
    assert (adjustment.delta, adjustment.actor) == (9, "admin")


def test_admin_rejects_negative_count(admin_client):
    row = KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    response = admin_client.post(
        f"/admin/history/keynode/{row.pk}/change/", {"count": "-1"}
    )
    assert response.status_code == 200
    assert b"greater than or equal to 0" in response.content
    row.refresh_from_db()
    assert row.count == 3


TOO_LARGE = "Ensure this value is less than or equal to 1000000000"


def test_counts_above_the_bound_are_refused_in_every_form(admin_client):
    row = create_key_node(key="jenkins", node="worker-1", count=3, actor="setup")
    change = f"/admin/history/keynode/{row.pk}/change/"
    response = admin_client.post(change, {"count": str(2**63 - 1)})
    assert response.status_code == 200
    assert TOO_LARGE in response.content.decode()
    response = admin_client.post(
        "/admin/history/keynode/", editable_post([row], [MAX_COUNT + 1])
    )
    assert response.status_code == 200
    assert TOO_LARGE in response.content.decode()
    response = admin_client.post(
        "/admin/history/keynode/add/",
        {"key": "maven", "node": "worker-9", "count": str(MAX_COUNT + 1)},
    )
    assert response.status_code == 200
    assert TOO_LARGE in response.content.decode()
    assert list(KeyNode.objects.values_list("key", "count")) == [("jenkins", 3)]
    assert CountAdjustment.objects.count() == 1


def test_the_largest_count_takes_later_placements_but_no_larger_edit(admin_client):
    row = create_key_node(key="jenkins", node="worker-1", count=3, actor="setup")
    response = admin_client.post(
        f"/admin/history/keynode/{row.pk}/change/", {"count": str(MAX_COUNT)}
    )
    assert response.status_code == 302
    for uid in ("u1", "u2"):
        place(uid, "jenkins", "worker-1")
    row.refresh_from_db()
    assert (type(row.count), row.count) == (int, MAX_COUNT + 2)
    assert audit_drift() == []
    response = admin_client.post(
        f"/admin/history/keynode/{row.pk}/change/", {"count": str(MAX_COUNT + 2)}
    )
    assert TOO_LARGE in response.content.decode()


def test_viewer_group_can_browse_but_not_edit(client):
    viewer = User.objects.create_user("viewer", password="s3cret-pass", is_staff=True)
    viewer.groups.add(Group.objects.get(name="ks-scheduler viewers"))
    row = KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    log_in(client, "viewer", "s3cret-pass")
    assert client.get("/admin/history/keynode/").status_code == 200
    client.post(f"/admin/history/keynode/{row.pk}/change/", {"count": "99"})
    row.refresh_from_db()
    assert row.count == 3


# --- KeyNode list: filters, sorting, inline edits, bulk actions, CSV ------------------


def changelist_rows(response):
    return [
        (row.key, row.node, row.count) for row in response.context["cl"].result_list
    ]


def make_rows():
    """Rows created the way the admin creates them, so the audit balances."""
    return [
        create_key_node(key=key, node=node, count=count, actor="setup")
        for key, node, count in [
            ("jenkins", "worker-1", 3),
            ("jenkins", "worker-2", 40),
            ("maven", "worker-1", 250),
            ("gitlab", "worker-3", 0),
        ]
    ]


def audit_drift():
    """(key, node) pairs whose count is not ledger rows + adjustments."""
    drift = []
    for row in KeyNode.objects.all():
        placed = sum(
            1
            for label in Placement.objects.filter(node=row.node).values_list(
                "label", flat=True
            )
            if row.key in placement_keys(label)
        )
        adjusted = (
            CountAdjustment.objects.filter(key=row.key, node=row.node).aggregate(
                total=Sum("delta")
            )["total"]
            or 0
        )
        if row.count != placed + adjusted:
            drift.append((row.key, row.node, row.count, placed, adjusted))
    # The shipped audit agrees.
    _, drifts = audit_counts()
    assert [(d.key, d.node) for d in drifts] == [(k, n) for k, n, *_ in drift]
    return drift


def test_keynode_filters_by_key_node_and_count_range(admin_client):
    make_rows()
    url = "/admin/history/keynode/"
    by_key = changelist_rows(admin_client.get(url, {"key": "jenkins"}))
    assert [(k, n) for k, n, _ in by_key] == [
        ("jenkins", "worker-1"),
        ("jenkins", "worker-2"),
    ]
    by_node = changelist_rows(admin_client.get(url, {"node": "worker-1"}))
    assert [(k, n) for k, n, _ in by_node] == [
        ("jenkins", "worker-1"),
        ("maven", "worker-1"),
    ]
    assert changelist_rows(admin_client.get(url, {"count_range": "10-99"})) == [
        ("jenkins", "worker-2", 40)
    ]
    assert changelist_rows(admin_client.get(url, {"count_range": "0"})) == [
        ("gitlab", "worker-3", 0)
    ]


def test_keynode_filters_by_kind_of_key(admin_client):
    make_rows()
    place("u1", "jenkins-java-maven", "worker-1")
    url = "/admin/history/keynode/"

    def keys(kind):
        response = admin_client.get(url, {"kind": kind})
        assert response.status_code == 200
        return sorted({key for key, _, _ in changelist_rows(response)})

    assert keys("segment") == ["gitlab", "java", "jenkins", "maven"]
    assert keys("prefix") == [
        "jenkins-*",
        "jenkins-java-*",
        "jenkins-java-maven-*",
    ]
    assert keys("pipeline") == ["jenkins-java-maven$"]
    # With another filter, and the kind shown in its column.
    response = admin_client.get(url, {"kind": "prefix", "node": "worker-1"})
    assert len(changelist_rows(response)) == 3
    assert b'<td class="field-kind">prefix</td>' in response.content
    # The filter's choices, and its query is the database's, not a Python loop.
    response = admin_client.get(url, {"kind": "pipeline"})
    assert b"?kind=segment" in response.content
    assert "LIKE" in str(response.context["cl"].queryset.query).upper()


def test_label_path_keys_are_added_edited_and_corrected_like_any_key(admin_client):
    place("u1", "jenkins-java", "worker-1")
    place("u2", "jenkins-java", "worker-1")
    response = admin_client.post(
        "/admin/history/keynode/add/",
        {"key": "jenkins-java-maven$", "node": "worker-2", "count": "4"},
    )
    assert response.status_code == 302
    response = admin_client.post(
        "/admin/history/keynode/add/",
        {"key": "jenkins-*-java", "node": "worker-2", "count": "4"},
    )
    assert response.status_code == 200
    assert b"is none of these" in response.content
    prefix = KeyNode.objects.get(key="jenkins-java-*", node="worker-1")
    pipeline = KeyNode.objects.get(key="jenkins-java$", node="worker-1")
    assert (prefix.count, pipeline.count) == (2, 2)
    response = admin_client.post(
        "/admin/history/keynode/", editable_post([prefix, pipeline], [5, 2])
    )
    assert response.status_code == 302
    run_action(admin_client, "halve_counts", [pipeline])
    prefix.refresh_from_db()
    pipeline.refresh_from_db()
    assert (prefix.count, pipeline.count) == (5, 1)
    adjustments = CountAdjustment.objects.values_list("key", "delta", "reason")
    assert sorted(adjustments) == [
        ("jenkins-java$", -1, "halved"),
        ("jenkins-java-*", 3, "admin_edit"),
        ("jenkins-java-maven$", 4, "admin_edit"),
    ]
    assert audit_drift() == []
    # A label-path row links to its placements and to the label it names.
    response = admin_client.get("/admin/history/keynode/", {"kind": "prefix"})
    assert (
        b"/admin/history/placement/?key=jenkins-java-%2A&amp;node=worker-1"
        in response.content
    )
    assert b"/admin/pipeline/?q=jenkins-java" in response.content
    placements = admin_client.get(
        "/admin/history/placement/", {"key": "jenkins-java-*", "node": "worker-1"}
    )
    shown = [p.pod_uid for p in placements.context["cl"].result_list]
    assert sorted(shown) == ["u1", "u2"]


def test_keynode_sorts_by_count(admin_client):
    make_rows()
    # Column 3 of list_display is count; "-" sorts descending.
    response = admin_client.get("/admin/history/keynode/", {"o": "-3"})
    counts = [count for _, _, count in changelist_rows(response)]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] == 250


def test_keynode_rows_link_to_placements_and_pipeline(admin_client):
    KeyNode.objects.create(key="maven", node="worker-1", count=2)
    response = admin_client.get("/admin/history/keynode/")
    assert b"/admin/history/placement/?key=maven&amp;node=worker-1" in response.content
    assert b"/admin/pipeline/?q=maven" in response.content


def editable_post(rows, counts):
    data = {
        "form-TOTAL_FORMS": str(len(rows)),
        "form-INITIAL_FORMS": str(len(rows)),
        "form-MIN_NUM_FORMS": "0",
        "form-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    for index, (row, count) in enumerate(zip(rows, counts, strict=True)):
        data[f"form-{index}-id"] = str(row.pk)
        data[f"form-{index}-count"] = str(count)
    return data


def test_inline_count_edit_is_saved_recorded_and_logged(admin_client):
    for uid, node in [("u1", "worker-1"), ("u2", "worker-1"), ("u3", "worker-1")]:
        place(uid, "jenkins", node)
    place("u4", "jenkins", "worker-2")
    first = KeyNode.objects.get(key="jenkins", node="worker-1")
    second = KeyNode.objects.get(key="jenkins", node="worker-2")
    response = admin_client.post(
        "/admin/history/keynode/", editable_post([first, second], [12, 1])
    )
    assert response.status_code == 302
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.count, second.count) == (12, 1)
    adjustment = CountAdjustment.objects.get()
    assert (adjustment.key, adjustment.node, adjustment.delta) == (
        "jenkins",
        "worker-1",
        9,
    )
    assert adjustment.reason == CountAdjustment.Reason.ADMIN_EDIT
    entry = LogEntry.objects.get(object_id=str(first.pk))
    assert entry.user.username == "admin"
    assert entry.get_change_message() == "Changed count from 3 to 12."
    history = admin_client.get(f"/admin/history/keynode/{first.pk}/history/")
    assert b"Changed count from 3 to 12." in history.content
    assert audit_drift() == []


def test_inline_count_edit_rejects_negative(admin_client):
    row = KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    response = admin_client.post("/admin/history/keynode/", editable_post([row], [-4]))
    assert response.status_code == 200
    assert b"greater than or equal to 0" in response.content
    row.refresh_from_db()
    assert row.count == 3
    assert not CountAdjustment.objects.exists()


def test_form_edit_is_logged_with_old_and_new(admin_client):
    row = create_key_node(key="jenkins", node="worker-1", count=7, actor="setup")
    admin_client.post(f"/admin/history/keynode/{row.pk}/change/", {"count": "2"})
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert entry.get_change_message() == "Changed count from 7 to 2."
    assert audit_drift() == []


def test_add_form_creates_row_with_adjustment(admin_client):
    response = admin_client.post(
        "/admin/history/keynode/add/",
        {"key": "maven", "node": "worker-9", "count": "4"},
    )
    assert response.status_code == 302
    row = KeyNode.objects.get(key="maven", node="worker-9")
    assert row.count == 4
    assert CountAdjustment.objects.get().delta == 4
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert entry.get_change_message() == "Added with count 4."


def run_action(client, action, rows, **extra):
    data = {"action": action, "_selected_action": [str(row.pk) for row in rows]}
    data.update(extra)
    return client.post("/admin/history/keynode/", data)


def test_bulk_halve_and_reset_are_recorded(admin_client):
    rows = make_rows()
    place("u1", "jenkins", "worker-1")
    jenkins_1 = KeyNode.objects.get(key="jenkins", node="worker-1")
    assert jenkins_1.count == 4
    response = run_action(admin_client, "halve_counts", rows[:3])
    assert response.status_code == 302
    counts = dict(KeyNode.objects.values_list("node", "count").filter(key="jenkins"))
    assert counts == {"worker-1": 2, "worker-2": 20}
    assert KeyNode.objects.get(key="maven").count == 125
    halved = LogEntry.objects.get(object_id=str(rows[1].pk))
    assert halved.get_change_message() == "Halved count from 40 to 20 (bulk action)."

    run_action(admin_client, "reset_counts", rows)
    reset = KeyNode.objects.filter(pk__in=[row.pk for row in rows])
    assert set(reset.values_list("count", flat=True)) == {0}
    # The rows not selected keep their counts: u1's label path.
    assert dict(KeyNode.objects.exclude(pk__in=reset).values_list("key", "count")) == {
        "jenkins-*": 1,
        "jenkins$": 1,
    }
    reasons = CountAdjustment.objects.exclude(actor="setup").values_list(
        "reason", flat=True
    )
    assert sorted(reasons) == ["halved"] * 3 + ["reset"] * 3
    # The row already at 0 has no adjustment and no log entry.
    assert not LogEntry.objects.filter(object_id=str(rows[3].pk)).exists()
    assert audit_drift() == []


def test_bulk_delete_goes_through_corrections(admin_client):
    rows = make_rows()
    response = run_action(admin_client, "delete_selected", rows[:2], post="yes")
    assert response.status_code == 302
    assert not KeyNode.objects.filter(key="jenkins").exists()
    deltas = sorted(
        CountAdjustment.objects.filter(reason="deleted").values_list("delta", flat=True)
    )
    assert deltas == [-40, -3]


def test_csv_export_of_the_selection(admin_client):
    rows = make_rows()
    response = run_action(admin_client, "export_csv", [rows[2], rows[0]])
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    lines = list(csv.reader(io.StringIO(response.content.decode())))
    assert lines[0] == ["key", "node", "count", "last_placed_at", "updated"]
    assert [line[:3] for line in lines[1:]] == [
        ["jenkins", "worker-1", "3"],
        ["maven", "worker-1", "250"],
    ]


def test_csv_cells_never_start_a_formula(admin_client):
    row = KeyNode.objects.create(key="=cmd", node="worker-1", count=1)
    response = run_action(admin_client, "export_csv", [row])
    assert "'=cmd" in response.content.decode()


# --- The SQLite write lock ------------------------------------------------------------

HOLD_WRITE_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


@contextmanager
def write_lock_held_elsewhere(seconds: float):
    """Another process holds the SQLite write lock for `seconds`, as the watcher
    does while it records a batch, or a shell with a write transaction open."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLD_WRITE_LOCK,
            connection.settings_dict["NAME"],
            str(seconds),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "locked"
        yield process
    finally:
        process.wait(timeout=30)
        process.stdout.close()


@pytest.fixture
def sqlite_timeout_1s():
    """KSSCHED_SQLITE_TIMEOUT=1 for this test's connection, so the tests are quick."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's write lock")
    options = connection.settings_dict["OPTIONS"]
    saved = options["timeout"]
    options["timeout"] = 1.0
    connection.close()
    yield
    options["timeout"] = saved
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_admin_edit_waits_out_a_write_lock_held_elsewhere(
    admin_client, sqlite_timeout_1s, settings
):
    settings.KSSCHED_ADMIN_WRITE_WAIT = 8
    row = create_key_node(key="jenkins", node="worker-1", count=3, actor="setup")
    started = time.monotonic()
    with write_lock_held_elsewhere(2.5):
        response = admin_client.post(
            f"/admin/history/keynode/{row.pk}/change/", {"count": "12"}
        )
    assert response.status_code == 302
    assert time.monotonic() - started >= 2.4
    row.refresh_from_db()
    assert row.count == 12
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert entry.get_change_message() == "Changed count from 3 to 12."
    assert audit_drift() == []


@pytest.mark.django_db(transaction=True)
def test_admin_edit_without_the_write_lock_in_time_changes_nothing_and_says_so(
    admin_client, sqlite_timeout_1s, settings
):
    settings.KSSCHED_ADMIN_WRITE_WAIT = 2
    rows = make_rows()
    with write_lock_held_elsewhere(6) as holder:
        started = time.monotonic()
        response = run_action(admin_client, "halve_counts", rows[:3])
        elapsed = time.monotonic() - started
        still_locked = holder.poll() is None
    assert response.status_code == 503
    assert elapsed >= 1.9 and still_locked
    assert response["Retry-After"] == "5"
    assert response.templates[0].name == "admin/request_refused.html"
    message = response.context["message"]
    assert message.startswith("Nothing was changed: another process held the")
    assert re.search(r"write lock for \d+ s", message)
    assert sorted(KeyNode.objects.values_list("count", flat=True)) == [0, 3, 40, 250]
    assert not CountAdjustment.objects.exclude(actor="setup").exists()
    assert not LogEntry.objects.exists()
    assert audit_drift() == []


# --- Viewers and anonymous users ------------------------------------------------------


@pytest.fixture
def viewer_client(client):
    viewer = User.objects.create_user("viewer", password=None, is_staff=True)
    viewer.groups.add(Group.objects.get(name="ks-scheduler viewers"))
    client.force_login(viewer)
    return client


def test_viewer_sees_no_edit_controls(viewer_client):
    row = KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    response = viewer_client.get("/admin/history/keynode/")
    assert response.status_code == 200
    assert b'name="form-0-count"' not in response.content
    assert b'name="_save"' not in response.content
    assert b"/admin/history/keynode/add/" not in response.content
    actions = [
        name for name, _ in response.context["action_form"].fields["action"].choices
    ]
    assert actions == ["", "export_csv"]
    detail = viewer_client.get(f"/admin/history/keynode/{row.pk}/change/")
    assert detail.status_code == 200
    assert b'name="count"' not in detail.content
    assert b'name="_save"' not in detail.content


def test_viewer_may_export_but_not_write(viewer_client):
    row = KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    exported = run_action(viewer_client, "export_csv", [row])
    assert exported["Content-Type"].startswith("text/csv")
    run_action(viewer_client, "reset_counts", [row])
    run_action(viewer_client, "delete_selected", [row], post="yes")
    viewer_client.post("/admin/history/keynode/", editable_post([row], [0]))
    row.refresh_from_db()
    assert row.count == 3
    assert not CountAdjustment.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "/admin/",
        "/admin/history/keynode/",
        "/admin/history/placement/",
        "/admin/pipeline/?q=maven",
    ],
)
def test_anonymous_users_are_sent_to_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_staff_without_history_permission_cannot_open_pipeline(client):
    User.objects.create_user("staff", password="s3cret-pass", is_staff=True)
    log_in(client, "staff", "s3cret-pass")
    assert client.get("/admin/pipeline/?q=maven").status_code == 403


@pytest.mark.parametrize(
    ("url", "params"),
    [
        ("/admin/history/keynode/", {"key": "mav\x00en"}),
        ("/admin/history/keynode/", {"node": "worker\x001"}),
        ("/admin/history/keynode/", {"q": "mav\x00en"}),
        ("/admin/history/placement/", {"key": "mav\x00en"}),
        ("/admin/history/placement/", {"node": "worker\x001"}),
        ("/admin/history/placement/", {"q": "\x00"}),
        ("/admin/history/countadjustment/", {"q": "\x00"}),
        ("/admin/history/keypolicy/", {"q": "\x00"}),
        ("/admin/history/nodepolicy/", {"q": "\x00"}),
        ("/admin/pipeline/", {"q": "jenkins-\x00java"}),
    ],
)
def test_a_nul_character_in_a_filter_or_search_is_refused_with_a_message(
    admin_client, url, params
):
    place("a", "jenkins-java-maven", "worker-1")
    response = admin_client.get(url, params)
    assert response.status_code == 400
    assert response.templates[0].name == "admin/request_refused.html"
    name = next(iter(params))
    assert f"The filter or search parameter &#x27;{name}&#x27; contains a NUL" in (
        response.content.decode()
    )
    assert f'href="{url}"' in response.content.decode()


# --- Placement ledger -----------------------------------------------------------------


def ledger(client, **params):
    response = client.get("/admin/history/placement/", params)
    assert response.status_code == 200
    return sorted(p.pod_uid for p in response.context["cl"].result_list)


def test_placement_ledger_filters_by_key_node_state_and_date(admin_client):
    place("a", "jenkins-java-maven", "worker-1")
    place("b", "jenkins-javascript", "worker-2", finished=True)
    place("c", "java", "worker-2", ago=timedelta(days=40))
    assert ledger(admin_client, key="java") == ["a", "c"]
    assert ledger(admin_client, node="worker-2") == ["b", "c"]
    assert ledger(admin_client, key="java", node="worker-2") == ["c"]
    assert ledger(admin_client, active="yes") == ["a", "c"]
    assert ledger(admin_client, active="no") == ["b"]
    since = (timezone.now() - timedelta(days=7)).isoformat()
    assert ledger(admin_client, bound_at__gte=since) == ["a", "b"]


def test_placement_ledger_is_read_only(admin_client):
    place("a", "jenkins", "worker-1")
    row = Placement.objects.get()
    listing = admin_client.get("/admin/history/placement/")
    assert b"/admin/history/placement/add/" not in listing.content
    assert admin_client.get("/admin/history/placement/add/").status_code == 403
    detail = admin_client.get(f"/admin/history/placement/{row.pk}/change/")
    assert detail.status_code == 200
    assert b'name="_save"' not in detail.content
    assert b"/admin/pipeline/?q=jenkins" in listing.content


# --- Overview and empty states --------------------------------------------------------


def test_index_empty_state_says_what_to_check(admin_client):
    response = admin_client.get("/admin/")
    assert b'id="ks-empty-state"' in response.content
    assert b"watch_pods" in response.content
    assert b"ks-pipeline: &lt;value&gt;" in response.content
    assert b"schedulerName: ks-scheduler" in response.content
    assert b"No watcher has reported yet" in response.content


def test_list_empty_state(admin_client):
    assert b'id="ks-empty-state"' in admin_client.get("/admin/history/keynode/").content
    KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    assert (
        b'id="ks-empty-state"'
        not in admin_client.get("/admin/history/keynode/").content
    )


def test_index_overview_totals_busiest_and_watcher(admin_client):
    place("a", "jenkins-java", "worker-1")
    place("b", "jenkins-java", "worker-1")
    place("c", "jenkins-go", "worker-2", finished=True)
    now = timezone.now()
    WatchState.objects.create(
        name="pods",
        resource_version="1234",
        last_event_at=now - timedelta(seconds=42),
        heartbeat_at=now - timedelta(seconds=3),
        relists=7,
        events=99,
    )
    response = admin_client.get("/admin/")
    body = response.content.decode()
    assert 'id="ks-empty-state"' not in body
    totals = response.context["totals"]
    # jenkins, java, go; jenkins-*, jenkins-java-*, jenkins-go-*; jenkins-java$,
    # jenkins-go$.
    assert totals == {"keys": 8, "nodes": 2, "placements": 3, "active": 2}
    busiest = response.context["busiest_keys"]
    assert [row["total"] for row in busiest] == [3, 3, 2, 2, 2]
    assert {row["key"]: row["kind"] for row in busiest} == {
        "jenkins": "segment",
        "jenkins-*": "prefix",
        "java": "segment",
        "jenkins-java-*": "prefix",
        "jenkins-java$": "pipeline",
    }
    # A label-path key links to the pipeline page of the label it names.
    assert '<td><a href="/admin/pipeline/?q=jenkins-java">jenkins-java$</a></td>' in (
        body
    )
    nodes = response.context["busiest_nodes"]
    # Every key of worker-1's two jenkins-java placements: 5 keys, 2 each.
    assert (nodes[0]["node"], nodes[0]["total"], nodes[0]["keys"]) == (
        "worker-1",
        10,
        5,
    )
    assert nodes[0]["active"] == 2
    assert "42 s ago" in body and "3 s ago" in body
    assert "<td>7</td>" in body and "1234" in body
    assert "No watcher has reported yet" not in body
    expected = "SQLite file" if connection.vendor == "sqlite" else "PostgreSQL"
    assert expected in response.context["database"]


def test_stale_watcher_is_flagged(admin_client):
    WatchState.objects.create(
        name="pods", heartbeat_at=timezone.now() - timedelta(minutes=30)
    )
    assert b"30 min ago" in admin_client.get("/admin/").content
    assert b"stale" in admin_client.get("/admin/").content


# --- Pipeline page --------------------------------------------------------------------


def chart_bars(content: bytes) -> dict[str, int]:
    svg = re.search(rb"<svg id=\"pipeline-chart\".*?</svg>", content, re.S)
    assert svg, "no chart on the page"
    root = ElementTree.fromstring(svg.group(0))
    namespace = "{http://www.w3.org/2000/svg}"
    groups = list(root.iter(f"{namespace}g"))
    # Highest score first, the score written on each bar.
    scores = [int(group.get("data-score")) for group in groups]
    assert scores == sorted(scores, reverse=True)
    for group in groups:
        on_bar = group.find(f"{namespace}text[@class='bar-score']").text
        assert on_bar == group.get("data-score")
        beside = group.find(f"{namespace}text[@class='bar-value']").text
        assert beside.startswith(
            f"{group.get('data-segment')} {group.get('data-count')}"
        )
    return {group.get("data-node"): int(group.get("data-count")) for group in groups}


def test_pipeline_page_for_a_key(admin_client):
    KeyNode.objects.create(key="maven", node="worker-1", count=5)
    KeyNode.objects.create(key="maven", node="worker-2", count=12)
    KeyNode.objects.create(key="gradle", node="worker-3", count=8)
    NodeRecord.objects.create(name="worker-4", uid="u4")
    place("a", "jenkins-java-maven", "worker-2")
    response = admin_client.get("/admin/pipeline/", {"q": "maven"})
    assert response.status_code == 200
    # worker-2 also got the placement: 12 + 1.
    assert chart_bars(response.content) == {"worker-2": 13, "worker-1": 5}
    scores = {row["node"]: row["score"] for row in response.context["scores"]}
    assert set(scores) == {"worker-1", "worker-2", "worker-3", "worker-4"}
    # Nodes with maven history beat the cold ones, which all score alike.
    assert min(scores["worker-1"], scores["worker-2"]) > scores["worker-3"]
    assert scores["worker-3"] == scores["worker-4"]
    # The page shows what the configured strategy would answer the scheduler now.
    nodes = sorted(scores)
    live = get_strategy().score(label="maven", nodes=nodes)
    assert [scores[node] for node in nodes] == live
    shown = re.findall(
        rb'<tr data-node="([^"]+)"><td>[^<]*</td><td class="score">(\d+)</td>',
        response.content,
    )
    assert {node.decode(): int(score) for node, score in shown} == scores
    assert [p.pod_uid for p in response.context["placements"]] == ["a"]


def test_pipeline_page_for_a_full_label(admin_client):
    KeyNode.objects.create(key="jenkins", node="worker-1", count=30)
    KeyNode.objects.create(key="maven", node="worker-2", count=2)
    place("a", "jenkins-java-maven", "worker-3")
    place("b", "jenkins-java-gradle", "worker-3")
    response = admin_client.get("/admin/pipeline/", {"q": "jenkins-java-maven"})
    # Per node, the count of the most specific segment it has.
    assert chart_bars(response.content) == {
        "worker-1": 30,
        "worker-2": 2,
        "worker-3": 1,
    }
    explained = {
        row["node"]: row["matched_segment"] for row in response.context["scores"]
    }
    assert explained == {
        "worker-1": "jenkins",
        "worker-2": "maven",
        "worker-3": "maven",
    }
    assert [p.pod_uid for p in response.context["placements"]] == ["a"]


def test_pipeline_page_with_warm_says_which_label_path_key_made_a_node_warm(
    admin_client, settings
):
    settings.KSSCHED_SCORING = "warm"
    place("a", "jenkins-java-maven", "worker-1")
    place("b", "jenkins-java-gradle", "worker-2")
    place("c", "gitlab-java-maven", "worker-3")
    # A label-path key looks up the label it names.
    response = admin_client.get("/admin/pipeline/", {"q": "jenkins-java-maven$"})
    assert response.context["q"] == "jenkins-java-maven"
    assert response.context["read_keys"] == [
        "jenkins-*",
        "jenkins-java-*",
        "jenkins-java-maven$",
    ]
    explained = {
        row["node"]: row["matched_segment"] for row in response.context["scores"]
    }
    # worker-3 ran another prefix's maven: not warm for this pipeline.
    assert explained == {
        "worker-1": "jenkins-java-maven$",
        "worker-2": "jenkins-java-*",
        "worker-3": None,
    }
    body = response.content.decode()
    assert "<th>Warm because of</th>" in body
    assert "exact: this very pipeline ran there" in body
    assert sorted(row["key"] for row in response.context["segments"]) == [
        "jenkins-*",
        "jenkins-java-*",
        "jenkins-java-maven$",
    ]


def test_pipeline_page_without_history(admin_client):
    response = admin_client.get("/admin/pipeline/")
    assert b'id="ks-empty-state"' in response.content
    response = admin_client.get("/admin/pipeline/", {"q": "maven"})
    assert b'id="pipeline-no-counts"' in response.content
    assert b'id="pipeline-chart"' not in response.content


def test_pipeline_page_escapes_input(admin_client):
    response = admin_client.get("/admin/pipeline/", {"q": "<script>x</script>"})
    assert b"<script>x</script>" not in response.content


def test_viewer_can_open_pipeline_page(viewer_client):
    KeyNode.objects.create(key="maven", node="worker-1", count=5)
    response = viewer_client.get("/admin/pipeline/", {"q": "maven"})
    assert chart_bars(response.content) == {"worker-1": 5}


# --- Bootstrap ------------------------------------------------------------------------


def test_superuser_bootstrap_from_environment(client, monkeypatch):
    monkeypatch.setenv("DJANGO_SUPERUSER_USERNAME", "ops")
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "a-long-pass-phrase-42")
    monkeypatch.setenv("DJANGO_SUPERUSER_EMAIL", "ops@example.com")
    call_command("createsuperuser", interactive=False, stdout=io.StringIO())
    user = User.objects.get(username="ops")
    assert user.is_superuser and user.email == "ops@example.com"
    log_in(client, "ops", "a-long-pass-phrase-42")
    assert client.get("/admin/").status_code == 200


def test_index_overview_names_the_workspace_depth_in_use(admin_client, settings):
    def shown():
        body = admin_client.get("/admin/").content.decode()
        cell = re.search(r'id="ks-workspace-depth">([^<]*)', body)
        assert cell, "no workspace depth on the overview"
        return " ".join(cell.group(1).split())

    settings.KSSCHED_WORKSPACE_DEPTH = 0
    assert shown().startswith("off: KSSCHED_WORKSPACE_DEPTH is 0")
    settings.KSSCHED_WORKSPACE_DEPTH = 4
    assert shown().startswith("4, as KSSCHED_WORKSPACE_DEPTH sets it")
    settings.KSSCHED_WORKSPACE_DEPTH = "auto"
    assert shown().startswith("auto, not measured yet")
    at = datetime(2026, 12, 7, 21, 0, tzinfo=UTC)
    LearnedDepth.objects.create(
        pk=1, depth=None, reason="too few outcomes", measured_at=at
    )
    assert shown().startswith(
        "auto, none named (too few outcomes): no workspace counts as gone; "
        "measured 2026-12-07 21:00 UTC"
    )
    LearnedDepth.objects.filter(pk=1).update(depth=3, reason="")
    assert shown().startswith("auto: 3, measured 2026-12-07 21:00 UTC")
