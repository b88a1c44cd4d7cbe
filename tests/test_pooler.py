"""PostgreSQL behind a pooler in transaction mode (PgBouncer, pool_mode=transaction).

Run by `make pytest-pgbouncer`, which points DATABASE_URL at a real PgBouncer
(.ci/postgres.sh, start_pgbouncer) and sets KSSCHED_PG_TRANSACTION_POOLER=true and
KSSCHED_TEST_POOLER=1; skipped elsewhere. Between two statements outside a
transaction the pooler may hand the client's next statement to another server
session. QuerySet.iterator() declares a server-side cursor in one statement and
fetches from it in the next, so without the setting a page that iterates loses its
cursor ("portal ... does not exist") whenever another client took its session.
"""

import http.client
import os
import threading
from datetime import timedelta
from urllib.parse import urlparse

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, connections
from django.test import Client
from django.utils import timezone

from history.corrections import create_key_node
from history.models import KeyNode
from tests.helpers import place, run_gunicorn

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("KSSCHED_TEST_POOLER") != "1",
        reason="needs PgBouncer in transaction mode: make pytest-pgbouncer",
    ),
    pytest.mark.django_db(transaction=True),
]


def rows(number=5):
    for index in range(number):
        create_key_node(key="ci", node=f"node-{index}", count=index + 1, actor="t")


def take_the_session_just_released():
    """Another client opens a transaction: the pooler gives it the server session
    used last (PgBouncer hands out the most recently used one first), and keeps it
    until the transaction ends. Returns that client's connection."""
    other = connections.create_connection("default")
    other.set_autocommit(False)
    with other.cursor() as cursor:
        cursor.execute("SELECT 1")
    return other


def test_the_setting_is_on_through_the_pooler():
    assert connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] is True


def test_a_server_side_cursor_loses_its_portal_through_the_pooler():
    """Why the setting exists: the failure it prevents, reproduced."""
    rows()
    settings_dict = {**connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS": False}
    reader = connections["default"].__class__(settings_dict)
    try:
        with reader.chunked_cursor() as cursor:
            cursor.execute("SELECT node FROM history_keynode ORDER BY node")
            assert cursor.fetchmany(1) == [("node-0",)]
            other = take_the_session_just_released()
            try:
                with pytest.raises(DatabaseError, match="does not exist"):
                    cursor.fetchmany(10)
            finally:
                other.rollback()
                other.close()
    finally:
        reader.close()


def test_iterator_reads_every_row_through_the_pooler_with_the_setting():
    rows()
    iterator = KeyNode.objects.order_by("node").iterator(chunk_size=1)
    first = next(iterator)
    other = take_the_session_just_released()
    try:
        rest = [row.node for row in iterator]
    finally:
        other.rollback()
        other.close()
    assert [first.node, *rest] == [f"node-{index}" for index in range(5)]


def test_admin_pages_and_outcomes_answer_every_time_under_concurrent_load():
    rows(20)
    ago = timedelta(hours=2)
    for index in range(40):
        place(f"uid-{index}", "ci-java", f"node-{index % 5}", ago=ago, finished=True)
    User.objects.create_superuser("admin", "admin@example.com", None)
    client = Client()
    client.force_login(User.objects.get(username="admin"))
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    paths = [
        "/admin/",
        "/admin/pipeline/?q=ci-java",
        "/admin/history/keynode/",
        "/api/outcomes/?since="
        + (timezone.now() - timedelta(days=1)).date().isoformat(),
        "/api/outcomes/workspaces/",
    ]
    statuses: list[tuple[str, int]] = []
    with run_gunicorn(workers=3) as (url, _process):
        address = urlparse(url)

        def visit():
            for _ in range(10):
                for path in paths:
                    conn = http.client.HTTPConnection(
                        address.hostname, address.port, timeout=30
                    )
                    try:
                        conn.request("GET", path, headers={"Cookie": cookie})
                        response = conn.getresponse()
                        response.read()
                        statuses.append((path, response.status))
                    finally:
                        conn.close()

        threads = [threading.Thread(target=visit) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    failed = [entry for entry in statuses if entry[1] != 200]
    assert len(statuses) == 4 * 10 * len(paths)
    assert failed == []
