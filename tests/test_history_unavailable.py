"""A read of the history that fails on a lost database session: tried once more on a
new connection, else a JSON error kube-scheduler can log (never an HTML 500)."""

import http.client
from urllib.parse import urlparse

import orjson
import pytest
from django.db import connection

from history import ledger
from tests.helpers import run_gunicorn

BODY = orjson.dumps(
    {
        "Pod": {"metadata": {"labels": {"ks-pipeline": "ci"}}},
        "Nodes": None,
        "NodeNames": ["n1", "n2"],
    }
)
EXPECTED = [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 1}]


def post(url, path, body=BODY):
    address = urlparse(url)
    conn = http.client.HTTPConnection(address.hostname, address.port, 10)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        conn.close()


def terminate_other_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return cursor.fetchone()[0]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_uncached_reads_survive_killed_sessions():
    ledger.increment_key_nodes(keys=["ci"], node="n1")
    env = {"KSSCHED_HISTORY_CACHE": "false"}
    with run_gunicorn(env, workers=2) as (url, _process):
        for _ in range(3):
            for _ in range(6):
                status, _type, answer = post(url, "/scheduler/priorities/pipeline")
                assert (status, orjson.loads(answer)) == (200, EXPECTED)
            assert terminate_other_sessions() >= 1
        for _ in range(6):
            status, kind, answer = post(url, "/scheduler/priorities/pipeline")
            assert (status, kind, answer[:80]) == (200, "application/json", answer[:80])
            assert orjson.loads(answer) == EXPECTED


@pytest.mark.django_db(transaction=True)
def test_history_that_cannot_be_read_is_a_json_503(client, settings):
    settings.KSSCHED_HISTORY_CACHE = False
    ledger.increment_key_nodes(keys=["ci"], node="n1")
    table = connection.ops.quote_name("history_keynode")
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO kssched_moved_away")
    try:
        for path in ("/scheduler/priorities/pipeline", "/scheduler/explain"):
            response = client.post(path, BODY, content_type="application/json")
            assert response.status_code == 503
            assert response["Content-Type"] == "application/json"
            error = orjson.loads(response.content)["Error"]
            assert error.startswith("history unavailable: ")
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE kssched_moved_away RENAME TO {table}")
