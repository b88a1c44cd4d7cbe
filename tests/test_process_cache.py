"""The process cache of history: one per process whatever the thread or connection
that reads, never changing what it handed out, never missing a write made while it
fetched, and within its byte budget. On the test database (SQLite or PostgreSQL)."""

import random
import subprocess
import sys
import threading

import orjson
import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from extender.scoring.strategies import get_strategy
from history import ledger
from history.reader import cache as cache_module
from history.reader import history_reader
from history.reader.cache import CachedReader, budget_bytes
from history.reader.sql import SqlReader
from tests.helpers import REPO, database_env, in_other_connection

pytestmark = pytest.mark.django_db(transaction=True)

NODES = [f"n{i}" for i in range(30)]
LABELS = ["ci-java-app", "ci-go-svc", "ci-java-lib", "cd-go-svc"]
# The most general key `warm` reads for LABELS[0]: its first segment's path.
GENERAL = "ci-*"


def place(uid, label, node):
    ledger.record_placement(
        pod_uid=uid, namespace="ci", name=uid, label=label, node=node
    )


def snapshot(history):
    """A deep copy of what a read handed out."""
    return (
        {key: dict(rows) for key, rows in history.by_key.items()},
        dict(history.active),
        dict(history.busy),
        dict(history.replaced),
    )


def warm_scores(label=LABELS[0]):
    return get_strategy("warm").score(label=label, nodes=NODES)


def read(label, reader=None):
    reader = reader or history_reader()
    return reader.read(keys=label.split("-"), label=label, nodes=NODES)


def assert_agrees(label):
    assert not connection.in_atomic_block
    assert snapshot(read(label)) == snapshot(read(label, SqlReader()))


def rows_read(queries):
    return [q for q in queries if "count > 0" in q["sql"] and "IN (" in q["sql"]]


def test_every_thread_reads_the_one_process_cache():
    for i, node in enumerate(NODES[:6]):
        place(f"p{i}", LABELS[i % 2], node)
    cache = history_reader()
    assert isinstance(cache, CachedReader)
    read(LABELS[0])
    seen = {}

    def other_thread():
        seen["reader"] = history_reader()
        with CaptureQueriesContext(connection) as queries:
            seen["history"] = snapshot(read(LABELS[0]))
        seen["rows_read"] = rows_read(queries)

    in_other_connection(other_thread)
    assert seen["reader"] is cache
    # Its own connection, and still no row of the label's keys read again.
    assert seen["rows_read"] == []
    assert seen["history"] == snapshot(read(LABELS[0], SqlReader()))
    # A write committed by that thread shows in this one's next read.
    in_other_connection(lambda: place("late", LABELS[0], "n29"))
    assert_agrees(LABELS[0])
    assert read(LABELS[0]).by_key["app"]["n29"][0] == 1


def test_what_a_read_handed_out_never_changes():
    place("a", LABELS[0], "n1")
    first = read(LABELS[0])
    kept = snapshot(first)
    place("b", LABELS[0], "n1")
    place("c", LABELS[0], "n2")
    ledger.finish_placement(pod_uid="a")
    second = read(LABELS[0])
    assert snapshot(first) == kept
    assert snapshot(second) != kept
    assert second.by_key["app"]["n1"][0] == 2
    assert_agrees(LABELS[0])


def test_a_write_seen_while_a_key_is_fetched_is_applied_when_it_is_kept(
    monkeypatch,
):
    """A write committed after a label's first fetch read its rows, and seen by
    another thread's read before the fetch is kept, is applied to the kept rows."""
    place("a", LABELS[0], "n1")
    read(LABELS[1])  # the cache is warm, but not on LABELS[0]'s own keys
    fetch = CachedReader._fetch
    raced = []

    def racing_fetch(self, keys):
        found = fetch(self, keys)
        if not raced:
            raced.append(keys)
            in_other_connection(lambda: place("b", LABELS[0], "n2"))
            # Another thread reads (so syncs) while this fetch is not kept yet.
            in_other_connection(lambda: read(LABELS[1]))
        return found

    monkeypatch.setattr(CachedReader, "_fetch", racing_fetch)
    history = read(LABELS[0])
    assert "app" in raced[0]
    assert history.by_key["app"]["n2"][0] == 1
    monkeypatch.undo()
    assert_agrees(LABELS[0])


def test_the_cache_stays_within_its_byte_budget(settings, monkeypatch):
    """Past KSSCHED_HISTORY_CACHE_MB the least recently used keys go: what stays is
    within the budget, or only the keys of the read being answered."""
    monkeypatch.setattr(cache_module, "KEY_BYTES", 1000)
    settings.KSSCHED_HISTORY_CACHE_MB = 6000 / 2**20  # six keys of a few rows
    rng = random.Random(3)
    labels = [f"team{i}-svc{i}" for i in range(12)]
    for label in labels:
        for node in rng.sample(NODES, 3):
            place(f"{label}-{node}", label, node)
    cache = history_reader()
    for label in labels * 2:
        read(label)
        keys = set(label.split("-"))
        assert cache.bytes <= budget_bytes() or set(cache.rows) == keys
        assert cache.row_bytes == sum(
            cache_module.KEY_BYTES + len(rows) * cache_module.ROW_BYTES
            for rows in cache.rows.values()
        )
    assert 2 <= len(cache.rows) <= 6
    # The most recently read label is held; the first ones were dropped.
    assert set(labels[-1].split("-")) <= set(cache.rows)
    assert not set(labels[0].split("-")) & set(cache.rows)
    for label in labels[:3]:
        assert_agrees(label)


def test_threads_reading_while_another_writes_end_in_agreement():
    for i, node in enumerate(NODES):
        place(f"p{i}", LABELS[i % len(LABELS)], node)
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader(seed):
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                history = read(rng.choice(LABELS))
                # A consistent view: every active pod's node is busy.
                for node, pods in history.active.items():
                    assert history.busy.get(node, 0) >= pods
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    try:
        rng = random.Random(9)
        for step in range(40):
            place(f"w{step}", rng.choice(LABELS), rng.choice(NODES))
            if step % 3 == 0:
                ledger.finish_placement(pod_uid=f"p{step}")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
    for label in LABELS:
        assert_agrees(label)


def test_with_no_read_alive_a_write_changes_what_is_cached_in_place():
    """kube-scheduler's serial calls: the previous call's read is gone when the
    next one syncs, so a write costs the nodes it changed, not a copy of every
    node the key holds (a general key holds most nodes). The rows, the running
    pods and the derived scores are the same objects, brought up to date."""
    for i, node in enumerate(NODES):
        place(f"p{i}", LABELS[0], node)
    cache = history_reader()
    warm_scores()
    warm_scores()  # combined from the second call
    rows, busy, active = cache.rows[GENERAL], cache.busy, cache.active
    derived = [entry.value for entry in cache.memo.derived[GENERAL].values()]
    combined = [entry.value for entry in cache.memo.labels.values()]
    assert derived and combined and not cache.memo.lent()
    place("w", LABELS[0], "n3")
    ledger.finish_placement(pod_uid="p4")
    scores = warm_scores()
    assert cache.rows[GENERAL] is rows and rows["n3"][0] == 2
    assert cache.busy is busy and "n4" not in busy
    assert cache.active is active
    now_derived = [entry.value for entry in cache.memo.derived[GENERAL].values()]
    now_combined = [entry.value for entry in cache.memo.labels.values()]
    assert list(map(id, now_derived)) == list(map(id, derived))
    assert list(map(id, now_combined)) == list(map(id, combined))
    assert_agrees(LABELS[0])
    # The same answer as a process that starts cold.
    cache.clear()
    assert warm_scores() == scores


def test_a_read_with_nothing_changed_opens_no_django_cursor(monkeypatch):
    """kube-scheduler's serial calls on a quiet history: the cache's look at what
    changed is all the database work. Django's first cursor of a request runs its
    health check (CONN_HEALTH_CHECKS, on PostgreSQL), a round trip of its own: 14 %
    of an extender worker's py-spy samples on serial calls for 100 nodes."""
    for i, node in enumerate(NODES):
        place(f"p{i}", LABELS[i % 2], node)
    scores = warm_scores()
    warm_scores()
    opened = []
    wrapper = type(connections["default"])
    cursor = wrapper.cursor

    def counting_cursor(self):
        opened.append(self.alias)
        return cursor(self)

    monkeypatch.setattr(wrapper, "cursor", counting_cursor)
    assert warm_scores() == scores
    assert opened == []
    place("w", LABELS[0], "n3")
    warm_scores()
    assert opened  # what changed is read through Django


def test_with_a_read_alive_a_write_replaces_what_it_holds():
    for i, node in enumerate(NODES[:10]):
        place(f"p{i}", LABELS[0], node)
    cache = history_reader()
    warm_scores()
    held = read(LABELS[0])
    kept = snapshot(held)
    rows, busy = cache.rows[GENERAL], cache.busy
    place("w", LABELS[0], "n3")
    ledger.finish_placement(pod_uid="p4")
    warm_scores()
    assert cache.rows[GENERAL] is not rows and cache.busy is not busy
    assert snapshot(held) == kept
    assert_agrees(LABELS[0])


def test_a_pod_that_starts_while_the_running_pods_are_read_counts_once(
    monkeypatch,
):
    """The running pods and the point of the change feed they include are read in
    one statement: a pod started between a mark taken apart and that read was
    counted twice (once in the read, once more as a change after the mark)."""
    place("a", LABELS[0], "n1")
    cache = history_reader()
    cache.clear()
    read_extra = CachedReader._read_extra
    raced = []

    def racing_read_extra(self):
        if self.running_stale and not raced:
            raced.append(True)
            in_other_connection(lambda: place("b", LABELS[0], "n1"))
        read_extra(self)

    monkeypatch.setattr(CachedReader, "_read_extra", racing_read_extra)
    read(LABELS[0])
    assert raced
    monkeypatch.undo()
    in_other_connection(lambda: place("c", LABELS[1], "n2"))
    history = read(LABELS[0])
    assert history.busy["n1"] == 2
    assert history.active["n1"] == 2
    assert_agrees(LABELS[0])


def test_inside_a_transaction_the_database_answers():
    place("a", LABELS[0], "n1")
    read(LABELS[0])
    with transaction.atomic():
        place("b", LABELS[0], "n1")
        assert read(LABELS[0]).by_key["app"]["n1"][0] == 2
        transaction.set_rollback(True)
    assert read(LABELS[0]).by_key["app"]["n1"][0] == 1


def test_greenlets_with_their_own_connections_share_one_warm_cache():
    """Under gevent's monkey patching every greenlet gets its own Django connection;
    the reads still share one cache: the label's rows are fetched once."""
    for i, node in enumerate(NODES[:8]):
        place(f"p{i}", LABELS[0], node)
    found = subprocess.run(
        [sys.executable, "-m", "tests.gevent_reads", LABELS[0], ",".join(NODES)],
        env=database_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    answer = orjson.loads(found.stdout.splitlines()[-1])
    assert answer["readers"] == 1
    assert answer["connections"] == 20
    assert answer["fetches"] == [sorted(set(LABELS[0].split("-")))]
    assert answer["agree"]
    expected = read(LABELS[0], SqlReader()).by_key
    assert answer["rows"] == {
        key: {node: list(row) for node, row in rows.items()}
        for key, rows in expected.items()
    }
