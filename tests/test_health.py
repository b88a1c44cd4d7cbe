"""Probes: /healthz (process up) and /readyz (database reachable, schema current)."""

import http.client
import json
import os
import shutil
import subprocess
import sys
from urllib.parse import urlparse

import pytest
from django.test import Client

from tests.helpers import REPO, free_port, run_gunicorn


def get(base_url, path):
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def sqlite_env(path) -> dict[str, str]:
    """Point a subprocess at a SQLite file, whatever database the suite uses."""
    return {"DATABASE_URL": "", "DATA_PATH": str(path)}


def migrate(env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=REPO,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO),
            "KSSCHED_READ_DOT_ENV": "0",
            "SECRET_KEY": "x" * 50,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_healthz_answers_ok_without_the_database(client):
    # No django_db mark: any database access here would fail the test.
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.content == b"ok"
    assert response["Content-Type"].startswith("text/plain")


def test_readyz_is_ready_with_a_migrated_database(db, client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready"}


def test_readyz_reports_events_the_watcher_skipped_and_stays_ready(db, client):
    from django.utils import timezone

    from history.models import WatchState

    WatchState.objects.create(name="nodes")
    at = timezone.now()
    WatchState.objects.create(
        name="pods",
        skipped_events=2,
        last_skipped="ADDED pods ci/p uid=u-1 rv=7: DataError: bigint out of range",
        last_skipped_at=at,
    )
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ready",
        "skipped_events": {
            "pods": {
                "count": 2,
                "last": "ADDED pods ci/p uid=u-1 rv=7: DataError: bigint out of range",
                "at": at.isoformat(),
            }
        },
    }


def test_probes_refuse_post(client):
    assert client.post("/healthz").status_code == 405


@pytest.mark.django_db
def test_probes_and_metrics_are_never_redirected_to_https(settings):
    settings.SECURE_SSL_REDIRECT = True
    client = Client()
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 200
    # The admin is redirected, so the setting is in effect.
    assert client.get("/admin/").status_code == 301


def test_readyz_fails_before_migrations_and_passes_after(tmp_path, db):
    database = tmp_path / "fresh.db"
    database.touch()
    env = sqlite_env(database)
    with run_gunicorn(env, workers=1) as (url, _process):
        assert get(url, "/healthz") == (200, b"ok")
        status, body = get(url, "/readyz")
        assert status == 503
        answer = json.loads(body)
        assert answer["status"] == "unready"
        assert "unapplied migration" in answer["reason"]
        assert "manage.py migrate" in answer["reason"]

        migrate(env)
        status, body = get(url, "/readyz")
        assert status == 200, body
        assert json.loads(body) == {"status": "ready"}


def test_readyz_fails_when_the_database_file_is_gone(tmp_path, db):
    directory = tmp_path / "data"
    directory.mkdir()
    env = sqlite_env(directory / "scheduler.db")
    migrate(env)
    with run_gunicorn(env, workers=1) as (url, _process):
        assert get(url, "/readyz")[0] == 200
        shutil.rmtree(directory)
        status, body = get(url, "/readyz")
        assert status == 503
        assert "does not exist" in json.loads(body)["reason"]
        # Liveness does not depend on the database: no restart loop for a DB outage.
        assert get(url, "/healthz") == (200, b"ok")


def test_readyz_fails_when_postgresql_is_unreachable(db):
    # Nothing listens on this port: every connection attempt is refused.
    env = {"DATABASE_URL": f"postgres://ks@127.0.0.1:{free_port()}/ks"}
    with run_gunicorn(env, workers=1) as (url, _process):
        status, body = get(url, "/readyz")
        assert status == 503
        reason = json.loads(body)["reason"]
        assert reason.startswith("database unreachable:")
        assert get(url, "/healthz") == (200, b"ok")
