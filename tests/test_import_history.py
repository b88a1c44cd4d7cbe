"""Importing the Go ks-scheduler's history: `import_history` and the automatic import
after `migrate`, on files built with the old tool's schema."""

import hashlib
import logging
import sqlite3
import subprocess
import sys
import tracemalloc
from io import StringIO

import orjson
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from extender.scoring.strategies import SeedStrategy, WarmStrategy
from history.audit import audit_counts
from history.corrections import create_key_node
from history.importing import import_old_history
from history.labels import key_kind
from history.models import CountAdjustment, HistoryImport, KeyNode
from history.nodenames import NODE_NAME_MAX_LENGTH
from history.old_history import (
    BAD_KEY,
    BAD_NODE,
    read_old_history_file,
    read_old_history_table,
)
from tests.helpers import REPO, database_env, place, run_concurrently

pytestmark = pytest.mark.django_db

# The old tool's only table, exactly as it created it.
OLD_SCHEMA = (
    "CREATE TABLE key_node(id INTEGER PRIMARY KEY AUTOINCREMENT, "
    "podkey VARCHAR(64) NULL, nodename VARCHAR(64) NULL, count INT(10) NULL)"
)
LONG_NODE = "ip-10-0-0-1-" + "n" * 52  # 64 characters, as VARCHAR(64) allowed
LONG_KEY = "k" * 64  # over a label value's 63 characters: can never match


def old_tool_file(path, rows, schema=OLD_SCHEMA):
    """A SQLite file as the old tool left it, holding (podkey, nodename, count) rows."""
    database = sqlite3.connect(path)
    database.execute(schema)
    database.executemany(
        "INSERT INTO key_node (podkey, nodename, count) VALUES (?, ?, ?)", rows
    )
    database.commit()
    database.close()
    return path


def run_import(*args):
    out = StringIO()
    call_command("import_history", *map(str, args), stdout=out)
    return out.getvalue()


def counts(kind=None):
    """(key, node) -> count, of the keys of one kind (`labels.key_kind`) if given."""
    return dict(
        ((key, node), count)
        for key, node, count in KeyNode.objects.values_list("key", "node", "count")
        if kind is None or key_kind(key) == kind
    )


def adjustments():
    return sorted(
        CountAdjustment.objects.values_list("key", "node", "delta", "reason", "actor")
    )


# Duplicates, unusable rows and 64-character names, as found in the wild.
WILD_ROWS = [
    ("jenkins", "node-1", 3),
    ("jenkins", "node-1", 4),  # a duplicate pair: 3 + 4
    ("jenkins", "node-1", 0),  # a third copy with nothing in it
    ("java", "node-1", 2),
    ("java", LONG_NODE, 5),
    ("maven", "node-2", 10),
    (None, "node-1", 3),
    ("", "node-1", 3),
    ("java", None, 3),
    ("java", "", 3),
    ("java", "node-3", None),
    ("java", "node-3", -4),
    ("java", "node-3", "many"),
    ("java", "node-3", 2.5),
    ("jenkins-java", "node-3", 6),
    (LONG_KEY, "node-3", 6),
    ("my app", "node-3", 6),
]


def test_import_sums_duplicates_and_records_each_change(tmp_path):
    path = old_tool_file(tmp_path / "scheduler.db", WILD_ROWS)
    output = run_import(path)
    assert counts() == {
        ("jenkins", "node-1"): 7,
        ("java", "node-1"): 2,
        ("java", LONG_NODE): 5,
        ("maven", "node-2"): 10,
    }
    assert adjustments() == [
        ("java", LONG_NODE, 5, "imported", "import_history"),
        ("java", "node-1", 2, "imported", "import_history"),
        ("jenkins", "node-1", 7, "imported", "import_history"),
        ("maven", "node-2", 10, "imported", "import_history"),
    ]
    assert audit_counts() == (4, [])
    record = HistoryImport.objects.get()
    assert (record.source, record.mode, record.actor) == (
        str(path),
        "add",
        "import_history",
    )
    assert (record.rows, record.pairs, record.changed, record.total) == (17, 4, 4, 24)
    assert record.skipped == 12
    assert (
        f"Read 17 rows from {path} (key_node): 4 pairs, 24 counts in total, " in output
    )
    assert "12 rows skipped." in output
    assert "Imported (mode add): 4 pairs written, 24 counts added" in output
    assert "import #" in output and "4 count adjustments (reason imported)" in output


def test_unusable_rows_are_skipped_and_reported_by_reason(tmp_path):
    path = old_tool_file(tmp_path / "scheduler.db", WILD_ROWS)
    output = run_import(path)
    expected = {
        "no key (NULL or empty)": 2,
        "no node (NULL or empty)": 2,
        "no count (NULL)": 1,
        "negative count": 1,
        "count is not a whole number": 2,
        "count 0 (no history)": 1,
        "key is not one label segment ('-', other characters, or over 63)": 3,
    }
    assert HistoryImport.objects.get().skipped_reasons == expected
    for reason, rows in expected.items():
        assert f"  skipped {rows}: {reason}\n" in output


def test_label_path_keys_and_non_label_characters_are_skipped(tmp_path):
    rows = [
        ("java$", "node-1", 5),
        ("jenkins-*", "node-1", 5),
        ("jénkins", "node-1", 2),
        ("java", "node-1", 1),
    ]
    output = run_import(old_tool_file(tmp_path / "scheduler.db", rows))
    assert counts() == {("java", "node-1"): 1}
    assert f"  skipped 3: {BAD_KEY}\n" in output


def test_node_names_up_to_the_column_length_are_kept(tmp_path):
    assert NODE_NAME_MAX_LENGTH == KeyNode._meta.get_field("node").max_length
    longest, too_long = "n" * NODE_NAME_MAX_LENGTH, "n" * (NODE_NAME_MAX_LENGTH + 1)
    rows = [("java", longest, 2), ("java", too_long, 3)]
    output = run_import(old_tool_file(tmp_path / "scheduler.db", rows))
    assert counts() == {("java", longest): 2}
    assert f"  skipped 1: {BAD_NODE}\n" in output


def test_node_names_kubernetes_would_reject_are_skipped_and_reported(tmp_path):
    # The API server rejects a pod whose node-affinity term names such a node.
    rows = [
        ("gitlab", "Worker_7", 2),
        ("gitlab", "Pinned.Node-UPPER", 3),
        ("gitlab", "node-.7", 1),
        ("gitlab", "ip-10-0-1-7.ec2.internal", 4),
    ]
    output = run_import(old_tool_file(tmp_path / "scheduler.db", rows))
    assert counts() == {("gitlab", "ip-10-0-1-7.ec2.internal"): 4}
    assert HistoryImport.objects.get().skipped_reasons == {BAD_NODE: 3}
    assert f"  skipped 3: {BAD_NODE}\n" in output


def test_the_old_file_is_opened_read_only_and_never_changed(tmp_path):
    path = old_tool_file(tmp_path / "scheduler.db", WILD_ROWS)
    before = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    run_import(path)
    run_import(path, "--mode", "replace", "--again")
    after = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scheduler.db"]


def test_dry_run_reports_and_writes_nothing(tmp_path):
    path = old_tool_file(tmp_path / "scheduler.db", WILD_ROWS)
    output = run_import(path, "--dry-run")
    assert "Read 17 rows" in output
    assert "Dry run (mode add): would write 4 pairs; nothing written." in output
    assert not KeyNode.objects.exists()
    assert not CountAdjustment.objects.exists()
    assert not HistoryImport.objects.exists()
    # A dry run is not an import: the real one still happens afterwards.
    run_import(path)
    assert counts()[("jenkins", "node-1")] == 7


def test_dry_run_of_replace_counts_only_the_pairs_that_would_change(tmp_path):
    create_key_node(key="jenkins", node="node-1", count=7, actor="a")
    create_key_node(key="maven", node="node-2", count=4, actor="a")
    path = old_tool_file(tmp_path / "scheduler.db", WILD_ROWS)
    output = run_import(path, "--mode", "replace", "--dry-run")
    # jenkins/node-1 already holds 7: three of the four pairs would change.
    assert "would write 3 pairs; nothing written." in output
    assert counts() == {("jenkins", "node-1"): 7, ("maven", "node-2"): 4}


def test_a_second_run_on_the_same_history_changes_nothing(tmp_path):
    path = old_tool_file(tmp_path / "scheduler.db", WILD_ROWS)
    run_import(path)
    first = (counts(), adjustments(), HistoryImport.objects.count())
    output = run_import(path)
    assert "Already imported on " in output
    assert "nothing written. Pass --again to import it again." in output
    # The same history in another file, rows in another order, is recognised too.
    shuffled = old_tool_file(tmp_path / "copy.db", list(reversed(WILD_ROWS)))
    assert "Already imported" in run_import(shuffled, "--mode", "replace")
    assert (counts(), adjustments(), HistoryImport.objects.count()) == first


@pytest.mark.django_db(transaction=True)
def test_two_imports_of_one_history_at_once_write_it_once(tmp_path):
    # Several replicas run `migrate` at once on PostgreSQL.
    history = read_old_history_file(old_tool_file(tmp_path / "s.db", large_rows(2000)))
    errors = run_concurrently(
        4,
        lambda: import_old_history(history=history, source="s.db", actor="t"),
    )
    assert errors == []
    assert HistoryImport.objects.count() == 1
    assert sum(counts().values()) == history.total
    assert audit_counts()[1] == []


def test_again_imports_the_same_history_on_purpose(tmp_path):
    path = old_tool_file(tmp_path / "scheduler.db", WILD_ROWS)
    run_import(path)
    output = run_import(path, "--again")
    assert "Imported again (--again)" in output
    assert counts()[("jenkins", "node-1")] == 14
    assert HistoryImport.objects.count() == 2
    assert audit_counts()[1] == []


def test_add_mode_adds_to_the_existing_history(tmp_path):
    for uid in ("u1", "u2"):
        place(uid, "jenkins-java", "node-1")
    path = old_tool_file(tmp_path / "scheduler.db", WILD_ROWS)
    run_import(path, "--mode", "add")
    assert counts()[("jenkins", "node-1")] == 2 + 7
    assert counts()[("java", "node-1")] == 2 + 2
    # The 4 imported pairs and the ledger's label path of jenkins-java on node-1.
    assert audit_counts() == (4 + 3, [])


def test_replace_mode_sets_the_imported_pairs_to_the_old_counts(tmp_path):
    for uid in ("u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8", "u9"):
        place(uid, "jenkins-java", "node-1")
    place("u10", "gradle", "node-9")
    weight_before = KeyNode.objects.get(key="java", node="node-1").decayed_weight
    path = old_tool_file(tmp_path / "scheduler.db", WILD_ROWS)
    output = run_import(path, "--mode", "replace")
    # The label-path rows the ledger wrote are not the Go tool's: left alone.
    assert counts(kind="prefix") == {
        ("jenkins-*", "node-1"): 9,
        ("jenkins-java-*", "node-1"): 9,
        ("gradle-*", "node-9"): 1,
    }
    assert counts(kind="segment") == {
        ("jenkins", "node-1"): 7,  # was 9
        ("java", "node-1"): 2,  # was 9
        ("java", LONG_NODE): 5,
        ("maven", "node-2"): 10,
        ("gradle", "node-9"): 1,  # not in the file: untouched
    }
    assert "Imported (mode replace): 4 pairs written, 24 counts set" in output
    deltas = {(key, node): delta for key, node, delta, _, _ in adjustments()}
    assert deltas == {
        ("jenkins", "node-1"): -2,
        ("java", "node-1"): -7,
        ("java", LONG_NODE): 5,
        ("maven", "node-2"): 10,
    }
    assert audit_counts() == (5 + 5, [])
    # A lowered count keeps its stored weight (scoring caps it at the count).
    assert KeyNode.objects.get(key="java", node="node-1").decayed_weight == (
        weight_before
    )


def test_imported_counts_are_history_placed_at_the_import(tmp_path, settings):
    settings.KSSCHED_HALF_LIFE_DAYS = 7
    path = old_tool_file(tmp_path / "scheduler.db", [("myapp", "node-1", 9)])
    run_import(path)
    _, weight, at = KeyNode.objects.values_list(
        "count", "decayed_weight", "decayed_at"
    ).get()
    assert weight == 9.0
    assert at == pytest.approx(timezone.now().timestamp(), abs=60)
    assert KeyNode.objects.get().last_placed_at is None
    # `seed` scores the imported counts as the Go tool did; `warm` reads label
    # paths, which the Go tool never recorded: the node is cold for it until the
    # watcher records a pod of the pipeline there.
    assert SeedStrategy().score(label="myapp", nodes=["node-1", "node-2"]) == [10, 1]
    assert WarmStrategy().score(label="myapp", nodes=["node-1", "node-2"]) == [1, 1]
    place("u1", "myapp", "node-1", finished=True)
    # One placement just made: 2 + round(1 / 2 * 8).
    assert WarmStrategy().score(label="myapp", nodes=["node-1", "node-2"]) == [6, 1]


# --- refused files --------------------------------------------------------------------


def not_sqlite(path):
    path.write_text("podkey,nodename,count\njava,node-1,3\n")
    return path


def random_bytes(path):
    path.write_bytes(bytes(range(256)) * 64)
    return path


def sqlite_without_key_node(path):
    database = sqlite3.connect(path)
    database.execute("CREATE TABLE history_keynode (key TEXT, node TEXT, count INT)")
    database.close()
    return path


def key_node_with_another_column(path):
    schema = OLD_SCHEMA.replace("count INT(10) NULL", "count INT(10) NULL, note TEXT")
    return old_tool_file(path, [("java", "node-1", 3)], schema)


def key_node_missing_a_column(path):
    schema = "CREATE TABLE key_node(id INTEGER PRIMARY KEY, podkey TEXT, count INT)"
    database = sqlite3.connect(path)
    database.execute(schema)
    database.close()
    return path


def missing(path):
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (not_sqlite, "not a SQLite database (file is not a database)"),
        (random_bytes, "not a SQLite database"),
        (sqlite_without_key_node, "no key_node table, so not a Go ks-scheduler"),
        (key_node_with_another_column, "(id, podkey, nodename, count, note), not"),
        (key_node_missing_a_column, "has the columns (id, podkey, count), not"),
        (missing, "no such file"),
    ],
)
def test_a_bad_file_is_refused_and_nothing_is_written(tmp_path, make, message):
    path = make(tmp_path / "old.db")
    with pytest.raises(CommandError) as refused:
        run_import(path)
    assert message in str(refused.value)
    assert str(refused.value).endswith("Nothing was written.")
    assert not KeyNode.objects.exists()
    assert not CountAdjustment.objects.exists()
    assert not HistoryImport.objects.exists()


def test_a_refused_file_exits_1_with_the_reason(tmp_path):
    path = not_sqlite(tmp_path / "old.db")
    result = subprocess.run(
        [sys.executable, "manage.py", "import_history", str(path)],
        cwd=REPO,
        env=database_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "Refused:" in result.stderr and "not a SQLite database" in result.stderr


# --- seed scores after the import -----------------------------------------------------

SCORED_ROWS = [
    ("jenkins", "n1", 30),
    ("jenkins", "n1", 15),  # n1: jenkins 45
    ("jenkins", "n2", 5),
    ("jenkins", "n3", 200),
    ("java", "n1", 12),
    ("java", "n2", 3),
    ("java", "n2", 4),  # n2: java 7
    ("maven", "n2", 1),
    ("myapp", "n3", 25),
    ("myapp", "n4", -3),  # skipped: n4 has no history
    ("gradle", "n4", None),  # skipped
]
NODES = ["n1", "n2", "n3", "n4", "n5"]
# Worked out by hand with the old tool's formula: for a label of n segments,
# s = 10 / n, the most specific segment i (from 0) with a row on the node scores
# int(i * s + s + count // 10), capped at 10; no row scores 1, no label 0.
EXPECTED_SEED_SCORES = {
    # s = 2.5. n1: java (1), 12 -> int(2.5 + 2.5 + 1) = 6. n2: maven (2), 1 ->
    # int(5 + 2.5 + 0) = 7. n3: myapp (3), 25 -> int(7.5 + 2.5 + 2) = 12 -> 10.
    "jenkins-java-maven-myapp": [6, 7, 10, 1, 1],
    # s = 10/3. n1: java (1), 12 -> int(6.67 + 1) = 7. n2: java (1), 7 -> int(6.67)
    # = 6. n3: jenkins (0), 200 -> int(3.33 + 20) = 23 -> 10.
    "jenkins-java-x": [7, 6, 10, 1, 1],
    # s = 5. n1: java (0), 12 -> int(5 + 1) = 6. n2: java (0), 7 -> 5. n4: gradle's
    # only row had no count.
    "java-gradle": [6, 5, 1, 1, 1],
    # s = 2. jenkins (0): n1 45 -> int(2 + 4) = 6; n2 5 -> 2; n3 200 -> 22 -> 10.
    "jenkins-a-b-c-d": [6, 2, 10, 1, 1],
    # s = 10. n2: maven 1 -> 10.
    "maven": [1, 10, 1, 1, 1],
    # s = 10. n3: 25 -> 12 -> 10. n4's only row had a negative count.
    "myapp": [1, 1, 10, 1, 1],
    "unknown-label": [1, 1, 1, 1, 1],
    None: [0, 0, 0, 0, 0],
}


@pytest.mark.django_db(transaction=True)
def test_seed_scores_after_the_import_are_the_old_tools(tmp_path):
    # Transactional: scoring goes through the SQLite cache as in production, warmed
    # before the import, so it must notice the imported counts.
    strategy = SeedStrategy()
    assert strategy.score(label="maven", nodes=NODES) == [1] * 5
    run_import(old_tool_file(tmp_path / "scheduler.db", SCORED_ROWS))
    scores = {
        label: strategy.score(label=label, nodes=NODES)
        for label in EXPECTED_SEED_SCORES
    }
    assert scores == EXPECTED_SEED_SCORES


# --- the automatic import after migrate -----------------------------------------------


# The old table in ks-scheduler's own database holds only what its column types
# allow on both backends.
TYPED_ROWS = [row for row in WILD_ROWS if not isinstance(row[2], (str, float))]


@pytest.fixture
def old_table_in_our_database():
    """The old tool's table in ks-scheduler's own database, as when both tools were
    pointed at the same DATA_PATH; dropped afterwards."""

    def make(rows, extra_column=""):
        schema = OLD_SCHEMA
        if connection.vendor == "postgresql":
            schema = schema.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "SERIAL")
            schema = schema.replace("INT(10)", "INTEGER")
        if extra_column:
            schema = schema.replace(" NULL)", f" NULL, {extra_column})")
        with connection.cursor() as cursor:
            cursor.execute(schema)
            cursor.executemany(
                'INSERT INTO key_node (podkey, nodename, "count") VALUES (%s, %s, %s)',
                rows,
            )

    yield make
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS key_node")


def test_migrate_imports_the_old_table_once_and_leaves_it(
    old_table_in_our_database, caplog
):
    old_table_in_our_database(TYPED_ROWS)
    caplog.set_level(logging.INFO, logger="history.importing")
    call_command("migrate", verbosity=0)
    assert counts()[("jenkins", "node-1")] == 7
    record = HistoryImport.objects.get()
    assert (record.actor, record.mode, record.pairs) == ("migrate", "add", 4)
    assert "Imported the Go ks-scheduler's history from its key_node table: " in (
        caplog.text
    )
    assert "15 rows read, 4 pairs written, 24 counts in total, 10 rows skipped" in (
        caplog.text
    )
    assert audit_counts() == (4, [])
    # Nothing happens on the next start, and the old tool's table is still there.
    caplog.clear()
    call_command("migrate", verbosity=0)
    assert counts()[("jenkins", "node-1")] == 7
    assert HistoryImport.objects.count() == 1
    assert "not importing it again" in caplog.text
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM key_node")
        assert cursor.fetchone()[0] == len(TYPED_ROWS)


def test_migrate_leaves_a_foreign_key_node_table_alone(
    old_table_in_our_database, caplog
):
    old_table_in_our_database([("java", "node-1", 3)], extra_column="owner TEXT")
    caplog.set_level(logging.INFO, logger="history.importing")
    call_command("migrate", verbosity=0)
    assert not KeyNode.objects.exists()
    assert not HistoryImport.objects.exists()
    assert "Did not import the Go ks-scheduler's history" in caplog.text
    assert caplog.records[-1].levelname == "ERROR"


def test_migrate_skips_history_already_imported_from_the_file(
    old_table_in_our_database, tmp_path, caplog
):
    # The engineer ran import_history on a copy of the old file first.
    run_import(old_tool_file(tmp_path / "copy.db", TYPED_ROWS))
    old_table_in_our_database(TYPED_ROWS)
    caplog.set_level(logging.INFO, logger="history.importing")
    call_command("migrate", verbosity=0)
    assert counts()[("jenkins", "node-1")] == 7
    assert HistoryImport.objects.count() == 1
    assert "its history was already imported (import #" in caplog.text


# --- a large file ---------------------------------------------------------------------


def large_rows(number):
    """`number` rows shaped like a real history: 50 CI systems and languages on
    every node, projects on a few; every tenth row repeats an earlier pair."""
    rows = []
    for i in range(number):
        if i % 10 == 9:
            key, node, _ = rows[i // 2]
        else:
            key = f"project{i % 9001}" if i % 3 else f"ci{i % 50}"
            node = f"ip-10-{i % 200}-{(i // 200) % 250}-7.eu-west-1.compute.internal"
        rows.append((key, node, 1 + i % 37))
    return rows


@pytest.mark.slow
def test_a_file_of_100000_rows_imports_exactly(tmp_path):
    rows = large_rows(100_000)
    expected: dict[tuple[str, str], int] = {}
    for key, node, count in rows:
        expected[key, node] = expected.get((key, node), 0) + count
    path = old_tool_file(tmp_path / "scheduler.db", rows)
    output = run_import(path)
    assert counts() == expected
    assert f"{len(expected)} pairs written, {sum(expected.values())} counts added" in (
        output
    )
    assert CountAdjustment.objects.count() == len(expected)
    assert audit_counts() == (len(expected), [])
    assert "Already imported" in run_import(path)


@pytest.mark.parametrize(
    "declared",
    [
        "podkey DATE NULL, nodename VARCHAR(64) NULL, count INT(10) NULL",
        "podkey VARCHAR(64) NULL, nodename VARCHAR(64) NULL, count DATE NULL",
        "podkey VARCHAR(64) NULL, nodename VARCHAR(64) NULL, count TIMESTAMP NULL",
    ],
)
def test_migrate_reads_the_old_table_as_raw_values_whatever_its_declared_types(
    declared, caplog
):
    if connection.vendor != "sqlite":
        pytest.skip("only SQLite keeps any value in a column of any declared type")
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE key_node(id INTEGER PRIMARY KEY, {declared})")
        cursor.executemany(
            'INSERT INTO key_node (podkey, nodename, "count") VALUES (%s, %s, %s)',
            [("java", "node-1", 3), ("java", "node-2", "not a date"), ("x y", "n", 1)],
        )
    try:
        caplog.set_level(logging.INFO, logger="history.importing")
        call_command("migrate", verbosity=0)
        assert counts() == {("java", "node-1"): 3}
        assert HistoryImport.objects.get().skipped_reasons == {
            "count is not a whole number": 1,
            "key is not one label segment ('-', other characters, or over 63)": 1,
        }
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS key_node")


def test_names_holding_a_nul_character_are_skipped_on_both_databases(tmp_path):
    # PostgreSQL text cannot hold NUL: such a row must never reach a query.
    rows = [("java", "node-1\x00x", 3), ("ja\x00va", "node-1", 2), ("java", "n-2", 4)]
    output = run_import(old_tool_file(tmp_path / "scheduler.db", rows))
    assert counts() == {("java", "n-2"): 4}
    assert f"  skipped 1: {BAD_NODE}\n" in output
    assert "Imported (mode add): 1 pairs written" in output


@pytest.mark.slow
def test_a_source_file_locked_by_another_writer_is_reported_as_locked(tmp_path):
    path = old_tool_file(tmp_path / "scheduler.db", [("java", "node-1", 3)])
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")  # as the old tool while it writes
    try:
        with pytest.raises(CommandError) as refused:
            run_import(path)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    message = str(refused.value)
    assert "locked by another writer" in message
    assert "not a SQLite database" not in message
    assert not KeyNode.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_write_locked_database_is_a_clear_refusal_not_a_traceback(tmp_path):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's write lock")
    path = old_tool_file(tmp_path / "scheduler.db", [("java", "node-1", 3)])
    options = connection.settings_dict["OPTIONS"]
    saved = options["timeout"]
    options["timeout"] = 0.5
    connection.close()
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # as the watcher while it records a batch
    try:
        with pytest.raises(CommandError) as refused:
            run_import(path)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        options["timeout"] = saved
        connection.close()
    assert str(refused.value).startswith(
        "Refused: ks-scheduler's database is locked by another writer (waited 0.5 s"
    )
    assert not KeyNode.objects.exists()
    assert not HistoryImport.objects.exists()


# --- bounded memory and progress ------------------------------------------------------


def test_the_hash_of_a_history_is_the_json_of_its_sorted_pairs(tmp_path):
    # Hashed item by item; equal to the hash of the whole JSON, as recorded by
    # earlier versions, so an import is still recognised after an upgrade.
    history = read_old_history_file(old_tool_file(tmp_path / "old.db", WILD_ROWS))
    whole = orjson.dumps(sorted(history.counts.items()))
    assert history.sha256 == hashlib.sha256(whole).hexdigest()


def peak_bytes(work):
    tracemalloc.start()
    try:
        result = work()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_migrate_reads_many_rows_of_few_pairs_in_bounded_memory(
    old_table_in_our_database,
):
    rows = [("ci", f"node-{i % 100}", 1) for i in range(200_000)]
    old_table_in_our_database(rows)
    history, peak = peak_bytes(read_old_history_table)
    assert (history.rows, history.pairs, history.total) == (200_000, 100, 200_000)
    # The rows are never all held (200 000 rows take about 40 MB).
    assert peak < 6 * 2**20


@pytest.mark.slow
def test_memory_grows_with_the_distinct_pairs_not_with_the_rows(tmp_path):
    rows = [(f"key{i % 500}", f"node-{i // 500}", 1) for i in range(100_000)]
    path = old_tool_file(tmp_path / "old.db", rows)
    history, peak = peak_bytes(lambda: read_old_history_file(path))
    assert history.pairs == 100_000
    # A pair holds one tuple and one sum; its names are shared with other pairs.
    assert peak / history.pairs < 200, peak / history.pairs


def test_long_imports_report_progress(tmp_path, monkeypatch):
    monkeypatch.setattr("history.old_history.PROGRESS_ROWS", 4)
    rows = [(f"k{i}", "node-1", 1) for i in range(10)]
    output = run_import(old_tool_file(tmp_path / "old.db", rows))
    lines = [line.split(": ", 1)[1] for line in output.splitlines() if " s: " in line]
    assert lines == [
        "read 4 rows, 4 pairs so far",
        "read 8 rows, 8 pairs so far",
        "wrote 10 of 10 pairs",
    ]
