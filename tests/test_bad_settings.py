"""Bad settings stop every process at start-up, in one line that names the variable,
its value and what is allowed; unknown KSSCHED_* variables are warned about."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO

# (variable, bad value, part of what the line says is allowed)
BAD = [
    ("KSSCHED_SCORING", "wram", "one of warm, seed"),
    ("KSSCHED_HALF_LIFE_DAYS", "0", "a number of days > 0 (e.g. 7)"),
    ("KSSCHED_HALF_LIFE_DAYS", "-3", "a number of days > 0"),
    ("KSSCHED_HALF_LIFE_DAYS", "abc", "a number of days > 0"),
    ("KSSCHED_HALF_LIFE_DAYS", "nan", "a number of days > 0"),
    ("KSSCHED_HALF_LIFE_DAYS", "inf", "a number of days > 0"),
    ("KSSCHED_HALF_LIFE_DAYS", "1e3", "a number of days > 0"),
    ("KSSCHED_HALF_LIFE_DAYS", "7days", "a number of days > 0"),
    ("KSSCHED_MAX_BODY_BYTES", "-1", "a whole number of bytes >= 1"),
    ("KSSCHED_NODE_RETENTION_DAYS", "abc", "a number of days >= 0"),
    ("CONN_MAX_AGE", "abc", "a whole number of seconds >= 0"),
    ("DATABASE_URL", "garbage", "postgres://USER:PASSWORD@HOST:PORT/NAME"),
    ("KSSCHED_HISTORY_CACHE_MB", "-5", "a number of MiB > 0"),
    ("KSSCHED_HISTORY_CACHE", "maybe", "true or false"),
    ("KSSCHED_WEBHOOK_MAX_NODES", "-1", "a whole number >= 1"),
    ("KSSCHED_PIPELINE_LABEL", "Bad_Label!", "a Kubernetes label key"),
    ("KSSCHED_WATCHER_METRICS_BIND", "9100", "HOST:PORT"),
    ("KSSCHED_LOG_FORMAT", "xml", "one of text, json"),
]
IDS = [f"{name}={value}" for name, value, _ in BAD]


def base_env(tmp_path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        # A developer's .env (written by `make run`) must not leak into these runs.
        "KSSCHED_READ_DOT_ENV": "0",
        "SECRET_KEY": "s" * 50,
        "DATA_PATH": str(tmp_path / "scheduler.db"),
    }


def run(arguments: list[str], env: dict[str, str]):
    """Run `python ARGUMENTS` from the checkout; (result, seconds it took)."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, *arguments],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result, time.monotonic() - started


def assert_stopped_in_one_line(result, seconds, name, value, allowed):
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"ks-scheduler: {name}={value!r} is not valid: ")
    assert allowed in lines[0]
    # Python and the imports take most of this; the bound leaves room for a busy CI.
    assert seconds < 5


ENTRY_POINTS = {
    "manage.py check": ["manage.py", "check"],
    "manage.py migrate": ["manage.py", "migrate", "--noinput"],
    "manage.py watch_pods": ["manage.py", "watch_pods", "--once"],
    "kssched.serve": ["-m", "kssched.serve"],
    "gunicorn": ["-m", "gunicorn", "-c", "kssched/gunicorn_conf.py", "kssched.wsgi"],
}


@pytest.mark.parametrize(("name", "value", "allowed"), BAD, ids=IDS)
@pytest.mark.parametrize("entry", ["manage.py check", "kssched.serve", "gunicorn"])
def test_a_bad_value_stops_the_process_in_one_line(
    tmp_path, entry, name, value, allowed
):
    env = {**base_env(tmp_path), name: value}
    result, seconds = run(ENTRY_POINTS[entry], env)
    assert_stopped_in_one_line(result, seconds, name, value, allowed)


@pytest.mark.parametrize("entry", ["manage.py migrate", "manage.py watch_pods"])
def test_migrate_and_the_watcher_stop_too(tmp_path, entry):
    env = {**base_env(tmp_path), "KSSCHED_HALF_LIFE_DAYS": "1e3"}
    result, seconds = run(ENTRY_POINTS[entry], env)
    assert_stopped_in_one_line(
        result, seconds, "KSSCHED_HALF_LIFE_DAYS", "1e3", "a number of days > 0"
    )
    assert not (tmp_path / "scheduler.db").exists()


def test_a_misspelled_variable_is_warned_about_by_name(tmp_path):
    env = {**base_env(tmp_path), "KSSCHED_SCORNG": "seed"}
    result, _ = run(ENTRY_POINTS["manage.py check"], env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines() == [
        "ks-scheduler: warning: KSSCHED_SCORNG is not a setting and is ignored "
        "(did you mean KSSCHED_SCORING?)"
    ]


def test_an_unreachable_database_is_no_bad_setting(tmp_path):
    env = {**base_env(tmp_path), "DATABASE_URL": "postgres://nobody@127.0.0.1:9/none"}
    result, _ = run(["manage.py", "check"], env)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(Path("/data").is_dir(), reason="this machine has /data")
def test_a_missing_data_folder_is_one_line_too(tmp_path):
    env = base_env(tmp_path)
    del env["DATA_PATH"]
    result, _ = run(ENTRY_POINTS["manage.py check"], env)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "ks-scheduler: DATA_PATH='' is not valid: required when /data does not "
        "exist: the SQLite file's path (in a checkout, `make run` writes it to .env)"
    ]
