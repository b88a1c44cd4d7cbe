"""Logs: readable text by default, one JSON object per line when set to json."""

import json
import logging
import sys
from datetime import datetime

import pytest

from kssched.logformat import JsonFormatter
from tests.helpers import run_gunicorn
from tests.test_http import request
from tests.test_settings import run_manage

SECRET = {"SECRET_KEY": "x" * 50}


def make_record(message, *args, exc_info=None, **extra):
    record = logging.getLogger("history.watch").makeRecord(
        "history.watch", logging.WARNING, __file__, 1, message, args, exc_info
    )
    record.__dict__.update(extra)
    return record


def test_json_record_has_time_level_logger_and_message():
    line = JsonFormatter().format(make_record("Recorded %s for pod %s", "x", "ns/p"))
    entry = json.loads(line)
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "history.watch"
    assert entry["message"] == "Recorded x for pod ns/p"
    stamp = datetime.fromisoformat(entry["time"])
    assert stamp.utcoffset().total_seconds() == 0
    assert set(entry) == {"time", "level", "logger", "message"}


def test_json_record_stays_on_one_line_with_newlines_and_tracebacks():
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        exc_info = sys.exc_info()
    line = JsonFormatter().format(make_record("two\nlines", exc_info=exc_info))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "two\nlines"
    assert "ValueError: bad" in entry["exc_info"]


def test_json_record_keeps_extra_fields():
    line = JsonFormatter().format(make_record("x", node="worker-1", rv=object()))
    entry = json.loads(line)
    assert entry["node"] == "worker-1"
    assert entry["rv"].startswith("<object object")


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_manage_py_logs_in_the_chosen_format(tmp_path, fmt):
    code = "import logging; logging.getLogger('history.watch').warning('hello %s', 'w')"
    result = run_manage(
        ["shell", "--no-imports", "-c", code],
        {**SECRET, "DATA_PATH": str(tmp_path / "db"), "KSSCHED_LOG_FORMAT": fmt},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    if fmt == "json":
        entry = json.loads(lines[0])
        assert entry["message"] == "hello w"
        assert entry["level"] == "WARNING"
        assert entry["logger"] == "history.watch"
    else:
        assert lines[0].endswith("WARNING history.watch: hello w")


def test_unknown_log_format_fails_at_startup(tmp_path):
    result = run_manage(
        ["check"],
        {**SECRET, "DATA_PATH": str(tmp_path / "db"), "KSSCHED_LOG_FORMAT": "xml"},
    )
    assert result.returncode != 0
    assert "KSSCHED_LOG_FORMAT='xml' is not valid: one of text, json" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_gunicorn_and_django_log_json_lines(settings):
    env = {"KSSCHED_LOG_FORMAT": "json", "KSSCHED_ACCESS_LOG": "1"}
    with run_gunicorn(env, workers=1) as (url, _process):
        port = url.rsplit(":", 1)[1]
        status, _, _ = request(
            url,
            "POST",
            "/scheduler/priorities/pipeline",
            b"{not json",
            {"Content-Type": "application/json", "Host": "localhost"},
        )
        assert status == 400
    text = (settings.TEST_DATA_DIR / f"gunicorn-{port}.log").read_text()
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    loggers = {entry["logger"] for entry in entries}
    assert {"gunicorn.error", "gunicorn.access", "extender.views"} <= loggers
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= set(entry)
    rejected = [e for e in entries if e["logger"] == "extender.views"]
    assert rejected[0]["level"] == "WARNING"
    assert "400" in rejected[0]["message"]


def test_python_warnings_come_out_as_json_lines(tmp_path):
    code = "import warnings; warnings.warn('old setting, use the new one')"
    result = run_manage(
        ["shell", "--no-imports", "-c", code],
        {**SECRET, "DATA_PATH": str(tmp_path / "db"), "KSSCHED_LOG_FORMAT": "json"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    entry = json.loads(result.stdout)
    assert entry["logger"] == "py.warnings"
    assert "UserWarning: old setting, use the new one" in entry["message"]
