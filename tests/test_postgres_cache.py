"""The PostgreSQL history cache: exact whatever the commit order and whoever writes,
and it starts over when it cannot be sure."""

import http.client
import http.cookiejar
import re
import time
import urllib.parse
import urllib.request
from datetime import timedelta

import orjson
import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from extender.scoring.strategies import SeedStrategy, WarmStrategy
from history import audit, corrections, ledger
from history.models import KeyNode, KeyPolicy, NodePolicy
from history.reader import history_reader, pg_look, postgres_cache, reading_ahead
from history.reader.cache import MAX_SYNC_PAIRS
from history.reader.postgres_cache import PostgresCacheReader
from history.reader.sql import SqlReader
from history.watcher.state import record_node_seen
from tests.helpers import in_other_connection, load_fixture, run_gunicorn

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

NODES = [f"n{i}" for i in range(12)]


@pytest.fixture(autouse=True)
def empty_change_log(transactional_db):
    """The log is not a model, so the test database's flush leaves it: each test
    starts without the rows of the ones before, and with a cache that starts over
    (the flush's TRUNCATE, which would tell it, is gone with the log)."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM history_change")
    reader = history_reader()
    if isinstance(reader, PostgresCacheReader):
        reader.clear()


LABELS = ["ci-java-app", "ci-go", "ci-java"]


def answers(reader, now=None):
    """Every label's seed and warm scores and explanations through `reader`."""
    now = now or timezone.now().timestamp()
    found = []
    for label in LABELS:
        for strategy in (SeedStrategy(reader=reader), WarmStrategy(reader=reader)):
            found.append(strategy.score(label=label, nodes=NODES, now=now))
            found.append(strategy.explain(label=label, nodes=NODES, now=now))
    return found


def assert_exact(cache):
    """The cache answers as the database does, right now."""
    now = timezone.now().timestamp()
    assert answers(cache, now) == answers(SqlReader(), now)


def place(uid, label="ci-java-app", node="n1"):
    ledger.record_placement(
        pod_uid=uid, namespace="ci", name=uid, label=label, node=node
    )


def raw_connection() -> psycopg.Connection:
    """A second session on the test database, outside Django."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params)


def test_history_reader_is_the_postgres_cache():
    assert isinstance(history_reader(), PostgresCacheReader)


def test_a_transaction_that_commits_after_a_later_one_is_not_missed():
    place("seed-1")
    cache = PostgresCacheReader()
    assert_exact(cache)
    early, late = raw_connection(), raw_connection()
    try:
        # `early` takes its transaction id first, `late` a later one; `late`
        # commits first, then the cache looks, then `early` commits.
        early.execute(
            "UPDATE history_keynode SET count = count + 40 "
            "WHERE key = 'ci-java-app$' AND node = 'n1'"
        )
        late.execute(
            "INSERT INTO history_keynode (key, node, count, decayed_weight, "
            "decayed_at, created, updated) VALUES "
            "('ci-java-*', 'n2', 7, 7.0, 0, now(), now())"
        )
        late.commit()
        assert_exact(cache)
        early.commit()
        assert_exact(cache)
        assert any(
            row["raw_count"] == 41 and row["node"] == "n1"
            for row in WarmStrategy(reader=cache).explain(
                label="ci-java-app", nodes=NODES
            )
        )
    finally:
        early.close()
        late.close()


def test_writes_from_every_path_reach_every_worker():
    for i, label in enumerate(LABELS * 3):
        place(f"p{i}", label, NODES[i % 5])
    caches = [PostgresCacheReader(), PostgresCacheReader()]

    def check():
        # Each cache on its own thread and connection, as a worker would.
        for cache in caches:
            in_other_connection(lambda cache=cache: assert_exact(cache))

    check()
    rows = list(KeyNode.objects.order_by("pk"))
    corrections.set_key_node_count(key_node=rows[0], count=90, actor="admin")
    check()
    corrections.halve_key_nodes(key_nodes=rows[1:4], actor="admin")
    check()
    corrections.delete_key_nodes(key_nodes=rows[4:6], actor="admin")
    check()
    place("watched", "ci-java-app", "n9")
    check()
    ledger.finish_placement(pod_uid="watched")
    check()
    audit.prune_placements(before=timezone.now() + timedelta(days=1))
    check()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE history_keynode SET count = 3 WHERE key = 'go'")
    check()
    KeyPolicy.objects.create(key="java", enabled=True, weight=2.0)
    NodePolicy.objects.create(key="ci", node="n3", action="pin")
    check()
    record_node_seen(name="n1", uid="a")
    record_node_seen(name="n1", uid="b")
    check()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE history_keypolicy")
    check()


def test_the_cache_survives_a_reconnect():
    place("a")
    cache = PostgresCacheReader()
    assert_exact(cache)
    connection.close()
    place("b", node="n2")
    assert_exact(cache)
    # A session killed under the cache: the next look reconnects once.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    killer = raw_connection()
    try:
        killer.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        killer.close()
    place_elsewhere = raw_connection()
    try:
        place_elsewhere.execute(
            "UPDATE history_keynode SET count = count + 5 WHERE node = 'n2'"
        )
        place_elsewhere.commit()
    finally:
        place_elsewhere.close()
    assert_exact(cache)
    assert cache.starts == 1


def test_a_worker_behind_the_pruned_log_starts_over(monkeypatch):
    place("a")
    stale, fresh = PostgresCacheReader(), PostgresCacheReader()
    assert_exact(stale)
    monkeypatch.setattr(postgres_cache, "RETENTION_SECONDS", 0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM history_change")
        written = cursor.fetchone()[0]
        # Two prune rounds: the first records the pending horizon, the second
        # moves the horizon past what `stale` still needs.
        for round_ in range(2):
            place(f"b{round_}", node="n3")
            assert_exact(fresh)
            fresh.prune()
        cursor.execute(
            "SELECT COUNT(*) FROM history_change AS c, history_change_horizon AS h "
            "WHERE c.xid < h.horizon"
        )
        behind = cursor.fetchone()[0]
        cursor.execute("SELECT COUNT(*) FROM history_change")
        left = cursor.fetchone()[0]
    assert behind == 0 and written > 0 and left < written + 8
    starts = stale.starts
    assert_exact(stale)
    assert stale.starts == starts + 1
    # A worker that looked within the retention did not start over.
    assert fresh.starts == 1


def test_more_changes_than_a_sync_takes_start_the_cache_over():
    place("a")
    cache = PostgresCacheReader()
    assert_exact(cache)
    before = cache.snapshot
    KeyNode.objects.bulk_create(
        KeyNode(key="ci-java-app", node=f"bulk-{i}", count=1)
        for i in range(MAX_SYNC_PAIRS + 10)
    )
    # The look stops one row past the bound: enough to know it is exceeded.
    with connection.cursor() as cursor:
        cursor.execute(pg_look.QUERY.replace("$1", "%s"), [before, before])
        assert len(cursor.fetchall()) == MAX_SYNC_PAIRS + 1
    assert_exact(cache)
    assert cache.starts == 2


def test_the_look_reads_the_change_log_through_its_index():
    """A burst of writes outruns the log's statistics: they still say the log is
    small while it holds 100 000 rows. A sequential scan of it would cost
    milliseconds per call, in the custom plans and in the generic one. The
    statistics are set by hand (autovacuum held off for the test), so the plan
    does not depend on when autovacuum last looked at the table."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE history_change SET (autovacuum_enabled = off)")
        try:
            cursor.execute("ANALYZE history_change")
            cursor.execute(
                "INSERT INTO history_change (kind, key, node) "
                "SELECT 0, 'ci', 'n' || i FROM generate_series(1, 100000) AS i"
            )
            cursor.execute("SELECT CAST(pg_current_snapshot() AS text)")
            snapshot = cursor.fetchone()[0]
            cursor.execute(pg_look.PREPARE.replace("kssched_look", "look_plan"))
            try:
                for mode in ("force_custom_plan", "force_generic_plan"):
                    cursor.execute(f"SET plan_cache_mode = {mode}")
                    cursor.execute("EXPLAIN EXECUTE look_plan(%s)", [snapshot])
                    plan = "\n".join(row[0] for row in cursor.fetchall())
                    assert "history_change_xid" in plan, plan
                    assert "Seq Scan on history_change " not in plan, plan
            finally:
                cursor.execute("RESET plan_cache_mode")
                cursor.execute("DEALLOCATE look_plan")
        finally:
            cursor.execute("ALTER TABLE history_change RESET (autovacuum_enabled)")


def test_a_look_whose_prepared_statement_is_gone_is_sent_unprepared():
    """Behind a transaction-pooling proxy a session's prepared statement can be
    missing on the server session a call reaches: the look goes on unprepared."""
    place("a")
    cache = PostgresCacheReader()
    assert_exact(cache)
    assert cache.prepared
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE kssched_look")
    place("b", node="n2")
    assert_exact(cache)
    assert not cache.prepared
    place("c", node="n3")
    assert_exact(cache)
    assert cache.starts == 1


def test_a_look_sent_ahead_answers_as_a_look_in_sync():
    place("a")
    cache = PostgresCacheReader()
    assert_exact(cache)
    place("b", node="n2")
    cache.look_ahead()
    assert cache.ahead is not None
    assert_exact(cache)
    assert cache.ahead is None
    # A write committed after the look was sent shows in the next answer.
    cache.look_ahead()
    writer = raw_connection()
    try:
        writer.execute("UPDATE history_keynode SET count = count + 9 WHERE node = 'n2'")
        writer.commit()
    finally:
        writer.close()
    cache.sync()
    assert_exact(cache)
    assert cache.starts == 1


def test_a_look_sent_ahead_and_never_taken_leaves_the_connection_idle():
    place("a")
    # The first look meets the connection; looks are sent ahead from then on.
    assert_exact(history_reader())
    with pytest.raises(ValueError):
        with reading_ahead():
            assert history_reader().ahead is not None
            raise ValueError("the request failed before reading history")
    assert history_reader().ahead is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM history_keynode")
        assert cursor.fetchone()[0] == KeyNode.objects.count() > 0
    assert_exact(history_reader())


def test_a_look_sent_ahead_on_a_connection_that_then_broke_is_sent_again():
    place("a")
    cache = PostgresCacheReader()
    assert_exact(cache)
    cache.look_ahead()
    killer = raw_connection()
    try:
        killer.execute(
            "SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid]
        )
        killer.execute("UPDATE history_keynode SET count = count + 3")
        killer.commit()
    finally:
        killer.close()
    assert_exact(cache)
    assert cache.starts == 1


def test_no_look_is_sent_ahead_inside_a_transaction():
    place("a")
    cache = PostgresCacheReader()
    assert_exact(cache)
    with transaction.atomic():
        cache.look_ahead()
        assert cache.ahead is None
        KeyNode.objects.filter(node="n1").update(count=5)
        assert_exact(cache)


def horizon() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT CAST(horizon AS text) FROM history_change_horizon")
        return int(cursor.fetchone()[0])


def test_the_log_is_pruned_in_bounded_batches(monkeypatch):
    monkeypatch.setattr(postgres_cache, "RETENTION_SECONDS", 0)
    monkeypatch.setattr(postgres_cache, "PRUNE_BATCH", 3)
    for i in range(4):
        place(f"p{i}", node=f"n{i}")
    cache = PostgresCacheReader()
    assert_exact(cache)
    deleted = [cache.prune() for _ in range(12)]
    assert all(number <= 3 for number in deleted)
    assert sum(1 for number in deleted if number) > 2
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM history_change AS c, history_change_horizon AS h "
            "WHERE c.xid < h.horizon"
        )
        assert cursor.fetchone()[0] == 0


def test_the_log_is_pruned_after_a_reply_not_while_answering(monkeypatch):
    monkeypatch.setattr(postgres_cache, "RETENTION_SECONDS", 0)
    place("a")
    cache = history_reader()
    assert_exact(cache)
    cache.prune()
    before = horizon()
    place("b", node="n2")
    cache.pruned_at = time.monotonic() - postgres_cache.PRUNE_EVERY - 1
    assert_exact(cache)
    assert horizon() == before
    response = Client(HTTP_HOST="localhost").post(
        "/scheduler/priorities/pipeline",
        load_fixture("prioritize-nodenames.json"),
        content_type="application/json",
    )
    assert response.status_code == 200
    assert horizon() > before
    assert_exact(cache)


def test_a_different_database_starts_the_cache_over():
    place("a")
    cache = PostgresCacheReader()
    assert_exact(cache)
    name = connection.settings_dict["NAME"]
    copy = f"{name}_copy"
    connection.close()
    admin = raw_connection()
    admin.autocommit = True
    try:
        admin.execute("SELECT 1")
        params = connection.get_connection_params()
        maintenance = psycopg.connect(
            **{
                **{
                    k: v
                    for k, v in params.items()
                    if k not in ("cursor_factory", "context")
                },
                "dbname": "postgres",
            },
            autocommit=True,
        )
        admin.close()
        maintenance.execute(f'DROP DATABASE IF EXISTS "{copy}"')
        maintenance.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{name}"')
        connection.settings_dict["NAME"] = copy
        connection.close()
        # Same rows, then a write in the copy only: the cache must not trust its
        # snapshot from the other database.
        with connection.cursor() as cursor:
            cursor.execute("UPDATE history_keynode SET count = 77")
        assert_exact(cache)
        assert cache.starts == 2
    finally:
        connection.close()
        connection.settings_dict["NAME"] = name
        maintenance.execute(f'DROP DATABASE IF EXISTS "{copy}"')
        maintenance.close()


def login(opener, base: str, username: str, password: str) -> None:
    page = opener.open(f"{base}/admin/login/").read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    data = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": token, "username": username, "password": password}
    ).encode()
    request = urllib.request.Request(
        f"{base}/admin/login/?next=/admin/", data, headers={"Referer": base}
    )
    assert "Log out" in opener.open(request).read().decode()


def test_an_admin_edit_on_one_replica_shows_in_the_next_answer_of_another():
    place("a", "ci-java-app", "n1")
    row = KeyNode.objects.get(key="app", node="n1")
    get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456")
    body = orjson.dumps(
        {
            "Pod": {"metadata": {"labels": {"ks-pipeline": "ci-java-app"}}},
            "NodeNames": ["n1", "n2"],
        }
    )
    with (
        run_gunicorn(workers=1) as (edit_url, _),
        run_gunicorn(workers=2) as (
            score_url,
            _,
        ),
    ):
        score = urllib.parse.urlparse(score_url)

        def prioritize():
            conn = http.client.HTTPConnection(score.hostname, score.port, timeout=10)
            try:
                conn.request(
                    "POST",
                    "/scheduler/priorities/pipeline",
                    body,
                    {"Content-Type": "application/json"},
                )
                return orjson.loads(conn.getresponse().read())
            finally:
                conn.close()

        before = [prioritize() for _ in range(4)]
        assert before[0] == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 1}]
        opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        login(opener, edit_url, "root", "pw-123456")
        change = f"{edit_url}/admin/history/keynode/{row.pk}/change/"
        page = opener.open(change).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        form = {
            "csrfmiddlewaretoken": token,
            "key": "app",
            "node": "n1",
            "count": "0",
            "_save": "Save",
        }
        request = urllib.request.Request(
            change, urllib.parse.urlencode(form).encode(), headers={"Referer": change}
        )
        opener.open(request).read()
        assert KeyNode.objects.get(pk=row.pk).count == 0
        # Both workers of the other replica answer with the edit at once.
        for _ in range(4):
            assert prioritize()[0] == {"Host": "n1", "Score": 6}


def running(reader):
    """The running pods a reader sees: every label's own and all of them."""
    found = []
    for label in LABELS:
        keys = label.split("-")
        history = reader.read(keys=keys, label=label, nodes=NODES)
        found.append((dict(history.active), dict(history.busy)))
    return found


def test_running_pods_are_followed_pod_by_pod():
    """After the first read, placements and finishes are applied from the log:
    the next read does not read every running pod again, and still agrees."""
    from django.test.utils import CaptureQueriesContext

    for i in range(6):
        place(f"r{i}", LABELS[i % 3], NODES[i])
    cache = history_reader()
    assert running(cache) == running(SqlReader())
    in_other_connection(lambda: place("late", "ci-go", "n3"))
    in_other_connection(lambda: ledger.finish_placement(pod_uid="r1"))
    with CaptureQueriesContext(connection) as queries:
        cache.read(keys=["ci", "go"], label="ci-go", nodes=NODES)
    assert not [q for q in queries if "finished_at IS NULL" in q["sql"]]
    assert running(cache) == running(SqlReader())
    assert_exact(cache)


def test_a_pod_read_whole_is_not_counted_again_by_the_next_look():
    """The running pods read whole after a look already hold a placement that the
    next look reports as new: it is counted once."""
    place("a", "ci-go", "n1")
    cache = history_reader()
    assert running(cache) == running(SqlReader())
    cache.running_changed()
    with reading_ahead():
        assert cache.ahead is not None
        # Committed after the look was sent, before the running pods are read.
        in_other_connection(lambda: place("b", "ci-go", "n2"))
        cache.read(keys=["ci", "go"], label="ci-go", nodes=NODES)
    assert cache.running_snapshot is not None
    assert running(cache) == running(SqlReader())
    in_other_connection(lambda: ledger.finish_placement(pod_uid="b"))
    assert running(cache) == running(SqlReader())
    assert_exact(cache)
