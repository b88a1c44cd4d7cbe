"""Admin bulk actions over many KeyNode rows: set-based, audited, seen by readers.

"Select all" on a busy prefix key selects a row per node it ran on; the actions
run a few statements for the whole selection (not a few per row), keep one
adjustment and one admin log entry per changed row, and the history caches of both
stores follow the change (the timing is measured by tools/bench/bulk_actions.py).
"""

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pytest_django.asserts import assertContains

from history import corrections
from history.admin_corrections import DELETE_LISTED
from history.audit import audit_counts
from history.models import CountAdjustment, KeyNode
from history.reader.postgres_cache import PostgresCacheReader
from history.reader.sql import SqlReader
from history.reader.sqlite_cache import SqliteCacheReader
from tests.helpers import place

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "jenkins-*"
ROWS = 300
NODES = [f"node-{i:04d}" for i in range(ROWS)]
# Statements one action may run for the whole selection, whatever its size: the
# admin's own (session, user, filters, counts) and a few per BULK_ROWS rows.
MAX_STATEMENTS = 40


@pytest.fixture
def busy_key():
    """ROWS rows of KEY (one per node, counts 1..ROWS, with their adjustments), a
    placement on the first node and a row of another key that must stay as it is."""
    corrections.add_key_node_counts(
        counts={(KEY, node): 1 + i for i, node in enumerate(NODES)},
        actor="setup",
        reason="import",
    )
    place("u1", "jenkins-java", NODES[0])
    corrections.create_key_node(key="maven", node=NODES[0], count=7, actor="setup")
    return dict(KeyNode.objects.filter(key=KEY).values_list("node", "count"))


def select_all(client, action, **extra):
    """`action` on every row of KEY, as "select all" on `?key=jenkins-*` posts it."""
    data = {
        "action": action,
        "select_across": "1",
        "index": "0",
        "_selected_action": [str(KeyNode.objects.filter(key=KEY).first().pk)],
        **extra,
    }
    with CaptureQueriesContext(connection) as queries:
        response = client.post(f"/admin/history/keynode/?key={KEY}", data)
    return response, len(queries)


def new_cache():
    return (
        SqliteCacheReader() if connection.vendor == "sqlite" else PostgresCacheReader()
    )


def seen(reader):
    """What `reader` reads of KEY on every node."""
    history = reader.read(keys=[KEY], label="jenkins", nodes=NODES)
    return {node: sorted(rows) for node, rows in history.rows.items()}


def test_halve_all_rows_of_a_key_is_set_based_audited_and_logged(
    admin_client, busy_key
):
    cache = new_cache()
    before = seen(cache)
    response, statements = select_all(admin_client, "halve_counts")
    assert response.status_code == 302
    assert statements <= MAX_STATEMENTS
    after = dict(KeyNode.objects.filter(key=KEY).values_list("node", "count"))
    assert after == {node: count // 2 for node, count in busy_key.items()}
    assert KeyNode.objects.get(key="maven").count == 7
    changed = [node for node, count in busy_key.items() if count // 2 != count]
    halved = CountAdjustment.objects.filter(reason="halved")
    assert sorted(halved.values_list("node", "delta")) == sorted(
        (node, busy_key[node] // 2 - busy_key[node]) for node in changed
    )
    assert set(halved.values_list("actor", flat=True)) == {"admin"}
    row = KeyNode.objects.get(key=KEY, node=NODES[41])
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert entry.get_change_message() == "Halved count from 42 to 21 (bulk action)."
    assert entry.object_repr == f"{KEY} on {NODES[41]}: 21"
    assert entry.action_time is not None and entry.user.username == "admin"
    history = admin_client.get(f"/admin/history/keynode/{row.pk}/history/")
    assertContains(history, "Halved count from 42 to 21 (bulk action).")
    assert LogEntry.objects.count() == len(changed)
    assert audit_counts()[1] == []
    # The cache read before the action follows it, as the plain statement reads it.
    assert seen(cache) == seen(SqlReader()) != before


def test_reset_all_rows_of_a_key_is_set_based_and_audited(admin_client, busy_key):
    cache = new_cache()
    seen(cache)
    response, statements = select_all(admin_client, "reset_counts")
    assert response.status_code == 302
    assert statements <= MAX_STATEMENTS
    assert set(KeyNode.objects.filter(key=KEY).values_list("count", flat=True)) == {0}
    assert CountAdjustment.objects.filter(reason="reset").count() == ROWS
    assert LogEntry.objects.count() == ROWS
    assert audit_counts()[1] == []
    assert seen(cache) == seen(SqlReader())


def test_delete_all_rows_of_a_key_lists_a_few_and_deletes_all(admin_client, busy_key):
    cache = new_cache()
    seen(cache)
    confirm, _ = select_all(admin_client, "delete_selected")
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert page.count("/admin/history/keynode/") >= DELETE_LISTED
    assert f"… and {ROWS - DELETE_LISTED} more keys on nodes" in page
    assert f"Keys on nodes: {ROWS}" in page

    response, statements = select_all(admin_client, "delete_selected", post="yes")
    assert response.status_code == 302
    assert statements <= MAX_STATEMENTS
    assert not KeyNode.objects.filter(key=KEY).exists()
    deleted = CountAdjustment.objects.filter(reason="deleted")
    assert sorted(deleted.values_list("node", "delta")) == sorted(
        (node, -count) for node, count in busy_key.items()
    )
    assert KeyNode.objects.get(key="maven").count == 7
    assert LogEntry.objects.count() == ROWS
    gone = LogEntry.objects.get(object_repr=f"{KEY} on {NODES[9]}: 10")
    assert gone.is_deletion() and gone.user.username == "admin"
    assert audit_counts()[1] == []
    assert seen(cache) == seen(SqlReader()) == {}


def test_bulk_corrections_of_rows_given_one_by_one_are_set_based(busy_key):
    rows = list(KeyNode.objects.filter(key=KEY))
    with CaptureQueriesContext(connection) as queries:
        changed = corrections.halve_key_nodes(key_nodes=rows, actor="shell")
        deleted = corrections.delete_key_nodes(key_nodes=rows[:100], actor="shell")
    assert changed == ROWS
    assert deleted == 100
    assert len(queries) <= 12
    assert audit_counts()[1] == []


def test_deleting_one_row_from_its_page_is_recorded_and_logged(admin_client, busy_key):
    row = KeyNode.objects.get(key=KEY, node=NODES[4])
    url = f"/admin/history/keynode/{row.pk}/delete/"
    assertContains(admin_client.get(url), f"{KEY} on {NODES[4]}: 5")
    response = admin_client.post(url, {"post": "yes"})
    assert response.status_code == 302
    assert not KeyNode.objects.filter(pk=row.pk).exists()
    assert CountAdjustment.objects.get(reason="deleted").delta == -5
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert entry.is_deletion() and entry.object_repr == f"{KEY} on {NODES[4]}: 5"
    assert audit_counts()[1] == []
