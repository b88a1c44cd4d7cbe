"""Greenlets and the database: concurrent webhook reviews in one gevent worker, plain
and over TLS, on SQLite or PostgreSQL (whichever the suite runs on), and psycopg
yielding to the gevent hub while it waits for the server.

With `monkey.patch_all(thread=False)` one Django connection was shared by every
greenlet of a worker, and on PostgreSQL 8 of 8 concurrent reviews hung: gevent
patches threads too, so each greenlet has its own connection."""

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from history.ledger import increment_key_nodes
from tests.attacks import WEBHOOK, request
from tests.helpers import REPO, database_env, log_path, run_servers
from tests.test_listeners import port_of
from tests.test_security import (  # noqa: F401 - pki is a fixture
    client_context,
    pki,
    tls_env,
)
from tests.test_webhook import new_pod, review

pytestmark = pytest.mark.django_db(transaction=True)


def eight_at_once(port: int, body: bytes, context=None, rounds: int = 5) -> None:
    with ThreadPoolExecutor(8) as pool:
        for _ in range(rounds):
            calls = [
                pool.submit(request, port, "POST", WEBHOOK, body, context, 10.0)
                for _ in range(8)
            ]
            statuses = [done.result()[0] for done in calls]
            assert statuses == [200] * 8, statuses


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_eight_concurrent_reviews_in_one_worker_all_answer(tls, pki):  # noqa: F811
    directory, _address = pki
    increment_key_nodes(keys=["ci", "java", "app"], node="n1")
    body = orjson.dumps(review(new_pod()))
    env = tls_env(directory, with_ca=False) if tls else {}
    context = client_context(directory) if tls else None
    # One web worker: all eight reviews are greenlets of the same process.
    with run_servers(env, web_workers=1, extender_workers=1) as (web, _, _):
        started = time.monotonic()
        eight_at_once(port_of(web), body, context)
        assert time.monotonic() - started < 30
    log = log_path(f"serve-{port_of(web)}").read_text()
    assert "Traceback" not in log
    assert "WORKER TIMEOUT" not in log


PSYCOPG_UNDER_GEVENT = """
import sys, time
from gevent import monkey
monkey.patch_all()
import gevent, psycopg, psycopg.waiting
assert psycopg.waiting.wait is not getattr(psycopg.waiting, "wait_c", None), "wait_c"
def sleep():
    with psycopg.connect(sys.argv[1]) as conn:
        conn.execute("SELECT pg_sleep(0.5)")
started = time.monotonic()
gevent.joinall([gevent.spawn(sleep) for _ in range(4)], raise_error=True)
print(round(time.monotonic() - started, 3))
"""


@pytest.mark.postgres
def test_psycopg_lets_other_greenlets_run_while_it_waits_for_the_server():
    """psycopg picks a wait function that yields when `select` is patched (its C
    one would block the hub): four 0.5 s queries in four greenlets overlap."""
    url = database_env()["DATABASE_URL"]
    result = subprocess.run(
        [sys.executable, "-c", PSYCOPG_UNDER_GEVENT, url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # One after another they would take 2 s.
    assert float(result.stdout.strip()) < 1.5, result.stdout
