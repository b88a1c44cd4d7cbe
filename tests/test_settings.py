"""Settings: secure by default, strict about secrets."""

import os
import subprocess
import sys

from tests.helpers import REPO


def run_manage(args, env):
    # A developer's .env (written by `make run`) must not leak into these runs.
    base = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "KSSCHED_READ_DOT_ENV": "0",
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_missing_secret_key_fails_at_startup(tmp_path):
    result = run_manage(["check"], {"DATA_PATH": str(tmp_path / "db.sqlite3")})
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    env = {
        "SECRET_KEY": "k" * 20 + "-production-like-secret-value-9f8e7d6c5b4a",
        "DATA_PATH": str(tmp_path / "db.sqlite3"),
        "KSSCHED_HTTPS": "1",
    }
    result = run_manage(["check", "--deploy", "--fail-level", "WARNING"], env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_debug_is_off_by_default():
    from django.conf import settings

    assert settings.DEBUG is False


def test_sqlite_runs_in_wal_with_immediate_transactions(db):
    from django.db import connection

    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
    assert connection.settings_dict["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


def test_data_path_folder_is_created(tmp_path):
    target = tmp_path / "nested" / "dir" / "scheduler.db"
    result = run_manage(
        ["migrate", "--noinput"], {"SECRET_KEY": "x" * 50, "DATA_PATH": str(target)}
    )
    assert result.returncode == 0, result.stderr
    assert target.exists()


def test_manage_py_without_django_points_to_the_venv(tmp_path):
    """`python manage.py` with a Python that has no Django (here the venv's own
    with `-S`, which leaves out site-packages) says where Django is, in one line."""
    result = subprocess.run(
        [sys.executable, "-S", "manage.py", "check"],
        cwd=REPO,
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"ks-scheduler: Django is not installed for {sys.executable}: run "
        "`make run`, or use .venv/bin/python manage.py ..."
    ]
