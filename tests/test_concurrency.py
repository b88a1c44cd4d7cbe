"""Everything at once, on the backend the suite runs on (SQLite file or PostgreSQL).

Three gunicorn workers answer prioritize in a loop, two real `manage.py watch_pods`
processes record the same pods from one fake API server, and an admin edits counts,
all at the same time. Afterwards: no request failed, nothing was locked out, every
count is exactly its placements plus the admin's changes, and `audit_counts` agrees.
"""

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from urllib.parse import urlparse

import orjson
import pytest
from django.conf import settings
from django.db import connection

from history import corrections
from history.models import KeyNode, Placement
from tests.fakeapi import FakeApiServer, make_pod, write_kubeconfig
from tests.helpers import REPO, database_env, run_gunicorn
from tests.watcher_process import (
    WatcherProcess,
    expected_counts,
    stored_counts,
    wait_until,
    watcher_env,
)

pytestmark = pytest.mark.django_db(transaction=True)

NODES = [f"node-{i}" for i in range(8)]
LABELS = ["ci-java-maven", "ci-java-gradle", "ci-go", "batch-etl-nightly"]
PODS = 90


class Prioritizer(threading.Thread):
    """Posts prioritize bodies in a loop, as kube-scheduler does, until stopped."""

    def __init__(self, base_url: str, stop: threading.Event, seed: int):
        super().__init__(daemon=True)
        self.url = urlparse(base_url)
        self.stop = stop
        self.rng = random.Random(seed)
        self.answered = 0
        self.failures: list[str] = []

    def run(self):
        import http.client

        while not self.stop.is_set():
            label = self.rng.choice(LABELS)
            body = orjson.dumps(
                {
                    "Pod": {"metadata": {"labels": {"ks-pipeline": label}}},
                    "Nodes": None,
                    "NodeNames": NODES,
                }
            )
            conn = http.client.HTTPConnection(self.url.hostname, self.url.port, 10)
            try:
                conn.request(
                    "POST",
                    "/scheduler/priorities/pipeline",
                    body,
                    {"Content-Type": "application/json"},
                )
                response = conn.getresponse()
                data = response.read()
            except OSError as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            finally:
                conn.close()
            if response.status != 200:
                self.failures.append(f"{response.status}: {data[:200]!r}")
                continue
            scores = orjson.loads(data)
            if [row["Host"] for row in scores] != NODES or not all(
                0 <= row["Score"] <= 10 for row in scores
            ):
                self.failures.append(f"bad answer {data[:200]!r}")
                continue
            self.answered += 1


class Admin(threading.Thread):
    """Edits counts through the corrections the admin uses, on its own connection.

    Remembers every change it made, as (key, node) -> total delta.
    """

    def __init__(self, stop: threading.Event):
        super().__init__(daemon=True)
        self.stop = stop
        self.rng = random.Random(11)
        self.deltas: Counter = Counter()
        self.edits = 0
        self.failures: list[str] = []

    def run(self):
        try:
            while not self.stop.is_set():
                self.edit_once()
                self.edits += 1
                time.sleep(0.01)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()

    def edit_once(self):
        rows = list(KeyNode.objects.order_by("?")[:2])
        if not rows:
            time.sleep(0.02)
            return
        row = rows[0]
        if self.rng.random() < 0.2:
            target = 0
        else:
            target = row.count + self.rng.randint(1, 4)
        delta = corrections.set_key_node_count(
            key_node=row, count=target, actor="admin"
        )
        self.deltas[row.key, row.node] += delta
        if self.rng.random() < 0.1:
            node = self.rng.choice(NODES)
            key = f"manual{self.edits}"
            corrections.create_key_node(key=key, node=node, count=3, actor="admin")
            self.deltas[key, node] += 3


def gunicorn_log(base_url: str) -> str:
    port = urlparse(base_url).port
    return (settings.TEST_DATA_DIR / f"gunicorn-{port}.log").read_text(errors="replace")


def test_prioritize_watchers_and_admin_at_once_lose_nothing(tmp_path):
    started = time.monotonic()
    placed: dict[str, tuple[str, str]] = {}
    rng = random.Random(5)
    with FakeApiServer(bookmark_interval=0.3) as server:
        kubeconfig = write_kubeconfig(tmp_path, server.url)
        watchers = []
        for name in ("watcher-a", "watcher-b"):
            (tmp_path / name).mkdir()
            env = watcher_env(
                database_env(),
                kubeconfig,
                tmp_path / name,
                KSSCHED_SQLITE_TIMEOUT="5",
            )
            watchers.append(
                WatcherProcess(env, ["--no-nodes"], tmp_path / f"{name}.log").start()
            )
        try:
            with run_gunicorn(workers=3) as (url, _process):
                stop = threading.Event()
                clients = [Prioritizer(url, stop, seed) for seed in range(3)]
                admin = Admin(stop)
                for thread in [*clients, admin]:
                    thread.start()
                for i in range(PODS):
                    name = f"pod-{i}"
                    label = rng.choice(LABELS)
                    server.add_pod(make_pod(name, label=label))
                    pod = server.bind_pod(name, rng.choice(NODES))
                    placed[pod["metadata"]["uid"]] = (label, pod["spec"]["nodeName"])
                    time.sleep(0.03)
                recorded = wait_until(
                    lambda: Placement.objects.count() >= PODS, timeout=20
                )
                time.sleep(0.5)  # let clients and the admin overlap a little more
                stop.set()
                for thread in [*clients, admin]:
                    thread.join(timeout=15)
                log = gunicorn_log(url)
        finally:
            codes = [watcher.stop()[0] for watcher in watchers]
        watcher_logs = [watcher.log for watcher in watchers]

    assert recorded, "the watchers did not record every pod"
    assert codes == [0, 0], watcher_logs
    failures = [f for client in clients for f in client.failures]
    assert failures == []
    assert admin.failures == []
    assert all(client.answered > 10 for client in clients)
    assert admin.edits > 10
    for text in [log, *watcher_logs]:
        assert "database is locked" not in text
        assert "Traceback" not in text

    # Exactly once: one ledger row per pod, though two watchers saw every pod.
    assert set(Placement.objects.values_list("pod_uid", flat=True)) == set(placed)
    expected = expected_counts(placed) + admin.deltas
    expected = Counter({pair: count for pair, count in expected.items() if count})
    assert stored_counts() == expected

    audit = subprocess.run(
        [sys.executable, "manage.py", "audit_counts"],
        cwd=REPO,
        env=database_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "no drift" in audit.stdout
    assert time.monotonic() - started < 60
