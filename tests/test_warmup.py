"""A worker's history cache warmed before it serves (extender.warmup): the labels of
the recent placements are scored once, one per label-path prefix first, so a fresh
worker's first calls find the shared prefixes read. On the test database."""

import time
import urllib.request

import pytest

from extender import warmup
from history.reader import history_reader
from history.reader.cache import CachedReader
from tests.helpers import _running, database_env, log_path, place, run_gunicorn
from tests.servers import free_port
from tests.test_listeners import port_of

pytestmark = pytest.mark.django_db(transaction=True)

LABELS = ["ci-java-maven-app1", "ci-java-maven-app2", "ci-go-mod-svc", "cd-go-mod-svc"]


def test_one_label_per_prefix_comes_first_general_prefixes_first():
    labels = ["a-b-c-x", "a-b-c-y", "a-d-e-z", "f-g"]
    order = warmup.warming_order(labels)
    # a-* (a-b-c-x), f-* (f-g), then a-b-* and a-b-c-* (a-b-c-x again), a-d-* and
    # a-d-e-* (a-d-e-z): each label once, the rest after.
    assert order == ["a-b-c-x", "f-g", "a-d-e-z", "a-b-c-y"]
    assert sorted(order) == sorted(labels)


def test_the_recent_labels_are_distinct_newest_first():
    for i, label in enumerate([*LABELS, LABELS[0]]):
        place(f"p{i}", label, f"n{i}")
    assert warmup.recent_labels() == [LABELS[0], *reversed(LABELS[1:])]
    assert warmup.recent_labels(limit=2) == [LABELS[0], LABELS[3]]


def test_a_warmed_cache_holds_the_prefixes_a_new_label_shares(warm, monkeypatch):
    """With `warm` (which reads label paths): after the warm start, a new label of
    a known prefix reads only its own key."""
    for i, label in enumerate(LABELS):
        for node in range(5):
            place(f"p{i}-{node}", label, f"n{node}")
    cache = history_reader()
    assert isinstance(cache, CachedReader)
    cache.clear()
    assert warmup.warm_start(seconds=30) == len(LABELS)
    assert {"ci-*", "ci-java-*", "ci-java-maven-*", "cd-go-*"} <= set(cache.rows)
    assert "ci-java-maven-*" in cache.memo.derived
    fetched: list[list[str]] = []
    fetch = CachedReader._fetch

    def recording_fetch(self, keys):
        fetched.append(sorted(keys))
        return fetch(self, keys)

    monkeypatch.setattr(CachedReader, "_fetch", recording_fetch)
    place("new", "ci-java-maven-app3", "n1")
    warmup.warm(["ci-java-maven-app3"], seconds=30)
    # Only the new pipeline's own key is read; its prefixes were warm.
    assert fetched == [["ci-java-maven-app3$"]]


def test_the_warm_start_stops_at_its_deadline():
    for i, label in enumerate(LABELS):
        place(f"p{i}", label, "n1")
    assert warmup.warm_start(seconds=0) == 0
    beats = []

    def slow_heartbeat():
        beats.append(time.monotonic())
        time.sleep(0.3)

    assert warmup.warm(LABELS, seconds=0.2, notify=slow_heartbeat) == 1
    assert len(beats) == 1


def test_a_worker_warms_its_cache_before_it_serves():
    """The real server, one worker: it scores the recent labels before serving."""
    for i, label in enumerate(LABELS):
        place(f"p{i}", label, "n1")
    with run_gunicorn(workers=1) as (url, _process):
        deadline = time.monotonic() + 30
        text = ""
        while "Warm start" not in text and time.monotonic() < deadline:
            time.sleep(0.1)
            text = log_path(f"gunicorn-{port_of(url)}").read_text()
    assert f"Warm start: {len(LABELS)} of {len(LABELS)} recent labels scored" in text


def test_another_application_served_with_the_config_boots_without_warming():
    """The bench's floor, a bare WSGI app under kssched/gunicorn_conf.py: Django is
    not set up in its workers, so there is nothing to warm and nothing may fail
    (a warm start that imported the models stopped every worker booting)."""
    port = free_port()
    env = {
        **database_env(),
        "KSSCHED_LISTENER": "extender",
        "KSSCHED_EXTENDER_BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": "1",
    }
    command = [
        "-m",
        "gunicorn",
        "-c",
        "kssched/gunicorn_conf.py",
        "tools.bench.floor:application",
    ]
    with _running(command, env, [port], f"floor-{port}") as process:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/scheduler/priorities/pipeline",
            data=b'{"Pod": {}, "NodeNames": ["a"]}',
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        assert process.poll() is None
    assert "Worker failed to boot" not in log_path(f"floor-{port}").read_text()
