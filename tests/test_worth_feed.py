"""The books of warmth's worth read the ledger by its `finished_at` index.

Every process with a book (the watcher, for its Events, and each web worker) reads
the pods that ended since its last read, once a minute. Without an index that
starts with `finished_at`, each read scanned the whole ledger: on `make
bench-e2e`'s history that was half a CPU-second a minute in the watcher, more than
its writes for 100 pods."""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from history.models import Placement
from history.worth_feed import LedgerWorth

pytestmark = pytest.mark.django_db(transaction=True)


def plan(sql: str) -> str:
    """The database's plan for `sql`, as text."""
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # A test's table is small enough for a scan to look cheaper.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(f"EXPLAIN {sql}")
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
        return "\n".join(" ".join(map(str, row)) for row in cursor.fetchall())


def ended(count: int) -> None:
    now = timezone.now()
    Placement.objects.bulk_create(
        Placement(
            pod_uid=f"uid-{i}",
            namespace="ci",
            name=f"pod-{i}",
            label=f"ci-app{i % 7}",
            node=f"node{i % 5}",
            bound_at=now - timedelta(minutes=i + 5),
            finished_at=now - timedelta(minutes=i),
            warmth=("exact", "partial", "cold")[i % 3],
            outcome=Placement.Outcome.SUCCEEDED,
            startup_seconds=5.0 + i % 4,
            run_seconds=60.0,
        )
        for i in range(count)
    )


def reads_of(worth: LedgerWorth) -> list[str]:
    table = Placement._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        assert worth.refresh(force=True)
    return [q["sql"] for q in queries.captured_queries if table in q["sql"]]


def test_first_and_later_reads_use_the_finished_index():
    ended(200)
    worth = LedgerWorth()
    first = reads_of(worth)
    ended_later = reads_of(worth)
    assert first and ended_later
    for sql in first + ended_later:
        assert "placement_finished" in plan(sql), (sql, plan(sql))
    # The read found the rows it planned for.
    assert sum(worth.book.estimate("ci-app1").runs.values()) > 0
