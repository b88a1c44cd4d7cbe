"""PostgreSQL-only behaviour: the upsert, lost sessions, and the commands over
DATABASE_URL. The rest of the suite also runs on PostgreSQL (`make test` runs it a
second time with TEST_DATABASE_URL); these tests check what only PostgreSQL has.
"""

import http.client
import subprocess
import sys
from urllib.parse import urlparse

import orjson
import pytest
from django.db import close_old_connections, connection, connections
from django.db.utils import InterfaceError, OperationalError
from django.test.utils import CaptureQueriesContext

from history import audit, ledger
from history.labels import placement_keys
from history.models import KeyNode, Placement
from tests.helpers import REPO, database_env, run_concurrently, run_gunicorn

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def terminate_other_sessions() -> int:
    """End every other session on the test database, as a failover or an
    administrator would; returns how many were ended."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return cursor.fetchone()[0]


def test_upsert_adds_with_the_table_qualified_count():
    with CaptureQueriesContext(connection) as queries:
        ledger.increment_key_nodes(keys=["a", "b"], node="n1")
        ledger.increment_key_nodes(keys=["a"], node="n1", by=4)
    table = KeyNode._meta.db_table
    assert f"count = {table}.count + excluded.count" in queries[-1]["sql"]
    assert dict(KeyNode.objects.values_list("key", "count")) == {"a": 5, "b": 1}


def test_upsert_is_atomic_under_eight_concurrent_clients():
    def client():
        for _ in range(100):
            ledger.increment_key_nodes(keys=["ci", "java", "new"], node="n1")

    assert run_concurrently(8, client) == []
    assert dict(KeyNode.objects.values_list("key", "count")) == {
        "ci": 800,
        "java": 800,
        "new": 800,
    }


def test_duplicate_placements_from_concurrent_writers_count_once():
    def writer():
        for i in range(40):
            ledger.record_placement(
                pod_uid=f"uid-{i}",
                namespace="ns",
                name=f"p{i}",
                label="ci-java",
                node=f"n{i % 4}",
            )

    assert run_concurrently(6, writer) == []
    assert Placement.objects.count() == 40
    assert sorted(KeyNode.objects.values_list("key", "node", "count")) == sorted(
        (key, f"n{n}", 10) for key in placement_keys("ci-java") for n in range(4)
    )
    assert audit.audit_counts()[1] == []


def test_a_killed_session_recovers_after_close_old_connections():
    """Queries fail once the server ends the session, until
    close_old_connections() (what the watcher calls before each unit of work)."""
    ledger.increment_key_nodes(keys=["k"], node="n")
    other = connections.create_connection("default")
    with other.cursor() as cursor:
        cursor.execute("SELECT 1")
    with other.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises((OperationalError, InterfaceError)), other.cursor() as cursor:
        cursor.execute("SELECT count FROM history_keynode")
    other.close()

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        own_pid = cursor.fetchone()[0]
    with connections.create_connection("default").cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [own_pid])
    with pytest.raises((OperationalError, InterfaceError)):
        KeyNode.objects.count()
    close_old_connections()
    assert KeyNode.objects.get(key="k").count == 1
    assert ledger.record_placement(
        pod_uid="after", namespace="ns", name="p", label="k", node="n"
    )
    assert KeyNode.objects.get(key="k").count == 2


def test_gunicorn_workers_reconnect_after_their_sessions_are_killed():
    ledger.increment_key_nodes(keys=["ci"], node="n1")
    body = orjson.dumps(
        {
            "Pod": {"metadata": {"labels": {"ks-pipeline": "ci"}}},
            "Nodes": None,
            "NodeNames": ["n1", "n2"],
        }
    )
    expected = [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 1}]

    with run_gunicorn(workers=2) as (url, _process):
        address = urlparse(url)

        def prioritize():
            conn = http.client.HTTPConnection(address.hostname, address.port, 10)
            try:
                conn.request(
                    "POST",
                    "/scheduler/priorities/pipeline",
                    body,
                    {"Content-Type": "application/json"},
                )
                response = conn.getresponse()
                return response.status, response.read()
            finally:
                conn.close()

        for _ in range(6):
            status, answer = prioritize()
            assert status == 200 and orjson.loads(answer) == expected
        assert terminate_other_sessions() >= 1
        # CONN_HEALTH_CHECKS: each worker tests its kept connection at the start of
        # the next request and reconnects, so no request fails.
        for _ in range(8):
            status, answer = prioritize()
            assert (status, orjson.loads(answer)) == (200, expected)


@pytest.mark.parametrize(
    "command",
    [
        ["migrate", "--check"],
        ["check", "--database", "default"],
        ["audit_counts"],
        ["showmigrations", "history"],
    ],
)
def test_management_commands_use_database_url(command):
    env = database_env()
    assert env["DATABASE_URL"].startswith("postgres://")
    result = subprocess.run(
        [sys.executable, "manage.py", *command],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    if command[0] == "showmigrations":
        assert "[ ]" not in result.stdout
        assert "[X] 0001_initial" in result.stdout
