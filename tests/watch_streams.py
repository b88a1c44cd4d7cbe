"""A pod watcher stream on the fake API server, for the in-process watcher tests
(tests/test_watch_*.py): options with small timeouts, counts, and a stream run in a
thread until a condition holds."""

import threading
import time
from contextlib import contextmanager

from django.db import connection

from history import audit
from history.labels import key_kind
from history.models import KeyNode
from history.watcher.heartbeat import Heartbeat
from history.watcher.loop import Stream
from history.watcher.options import Options
from history.watcher.pods import PodHandler
from tests.fakeapi import make_pod

NS = "ks-pipelines"


def options(**overrides):
    values = dict(
        scheduler_name="ks-scheduler",
        pipeline_label="ks-pipeline",
        server_timeout=(2, 3),
        backoff_base=0.05,
        backoff_cap=0.3,
        backoff_reset=5,
    )
    values.update(overrides)
    return Options(**values)


def pod_stream(api, tmp_path=None, **overrides):
    heartbeat = Heartbeat(tmp_path / "hb" if tmp_path else None)
    opts = options(**overrides)
    return Stream(api, PodHandler(opts), options=opts, heartbeat=heartbeat)


def counts():
    """The segment counts (the label-path rows move in the same upsert, and the
    audit, `assert_no_drift`, proves those too)."""
    return {
        (k.key, k.node): k.count
        for k in KeyNode.objects.all()
        if k.count and key_kind(k.key) == "segment"
    }


def assert_no_drift():
    checked, drifts = audit.audit_counts()
    assert drifts == []
    return checked


def bound(name, node, uid=None, label="pipeline1", rv="1", **kw):
    return make_pod(name, uid=uid, node=node, label=label, rv=rv, **kw)


@contextmanager
def running(stream):
    """stream.run() in a thread while the block runs; then shut it down."""
    errors = []

    def target():
        try:
            stream.run()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stream.shutdown.set()
        stream.interrupt()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert errors == []


def wait_until(predicate, timeout=10.0):
    """Whether predicate() holds within `timeout` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    return predicate()


def run_until(stream, predicate, timeout=10.0):
    """Run stream.run() in a thread until predicate() holds; then stop it."""
    with running(stream):
        return wait_until(predicate, timeout)
