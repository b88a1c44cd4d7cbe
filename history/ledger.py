"""Recording placements: the ledger and the counts it drives.

The watcher is the only caller in production. A placement is one ledger row per pod
UID, and the KeyNode counts of its label's keys (`labels.placement_keys`: its
segments and its label path) move in the same transaction,
so a replay or relist changes nothing and `audit_counts` can prove every count.
Counts only ever move through atomic SQL (`count = count + n`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from history.labels import distinct_keys, path_keys, placement_keys
from history.models import MAX_COUNT, KeyNode, Placement
from history.reader.depths import depth_in, pipeline_key
from history.reader.sql import SqlReader, read_recent
from history.recency import (
    WARM_MIN_WEIGHT,
    carried_weight_sql,
    halvings_sql,
    weight_now,
)


def increment_key_nodes(
    *,
    keys: Iterable[str],
    node: str,
    by: int = 1,
    now: datetime | None = None,
) -> None:
    """Add `by` to KeyNode(key, node) for every key, creating missing rows.

    One statement: an upsert whose update adds to the stored count (qualified with the
    table name, as PostgreSQL requires). Safe against concurrent writers on both
    backends; duplicate keys in `keys` are counted once.

    The same statement keeps the recency state (`decayed_weight` valued at
    `decayed_at`) exact: the stored weight and the new one are both carried to the
    later of the two instants, halving once per half-life, then added (see
    `accumulate_decayed`, which does the same in Python for the simulator). A row
    without recency state (made by hand, `decayed_at` 0) starts from its count.

    Callers write a ledger row (`record_placement`) or an adjustment in the same
    transaction: the SQLite cache learns of count changes from those rows only, and
    `audit_counts` proves counts from them.
    """
    if isinstance(by, bool) or not isinstance(by, int) or not 1 <= by <= MAX_COUNT:
        raise ValueError(f"by must be an integer from 1 to {MAX_COUNT}, not {by!r}")
    unique_keys = distinct_keys(keys)
    if not unique_keys:
        return
    now = now or timezone.now()
    at = now.timestamp()
    table = KeyNode._meta.db_table
    rows = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s)"] * len(unique_keys))
    params: list[str | int | float | datetime] = []
    for key in unique_keys:
        params += [key, node, by, float(by), at, now, now, now]
    sql = (
        f"INSERT INTO {table} (key, node, count, decayed_weight, decayed_at, "
        f"last_placed_at, created, updated) "
        f"VALUES {rows} {add_counts_on_conflict(placed=True)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def add_counts_on_conflict(*, placed: bool) -> str:
    """The ON CONFLICT clause of an insert into KeyNode that adds the new rows'
    counts to existing rows, as placements made at the new rows' `decayed_at`.

    The stored weight is carried to the later of the two instants (a row without
    recency state starts from its count) and the new weight, carried there too, is
    added: the one home of this arithmetic (`recency.accumulate_decayed` does the
    same in Python). `placed` also moves `last_placed_at` (hand edits leave it).
    """
    table = KeyNode._meta.db_table
    stored, new = f"{table}.decayed_at", "excluded.decayed_at"
    carried = carried_weight_sql(
        count=f"{table}.count", weight=f"{table}.decayed_weight", at=stored, later=new
    )
    placed_at = "last_placed_at = excluded.last_placed_at, " if placed else ""
    return (
        f"ON CONFLICT (key, node) DO UPDATE SET "
        f"count = {table}.count + excluded.count, "
        f"decayed_weight = {carried} "
        f"+ excluded.decayed_weight * {halvings_sql(stored, new)}, "
        f"decayed_at = CASE WHEN {new} > {stored} THEN {new} ELSE {stored} END, "
        f"{placed_at}updated = excluded.updated"
    )


def placement_table() -> str:
    """The ledger's table, quoted as Django quotes it in its own statements."""
    return connection.ops.quote_name(Placement._meta.db_table)


@dataclass(frozen=True)
class Entered:
    """A placement entered into the ledger now: its warmth, and the history it was
    judged from ((key, count) as `warm_history` gives them)."""

    warmth: str
    history: tuple[tuple[str, int], ...]
    # With `depth`, for an exact placement: how many other pipelines were placed on
    # the node since this one last was (`reader.depths`: DEEPEST for as many or
    # more; None when not asked, or not told).
    depth: int | None = None


def record_placement(
    *,
    pod_uid: str,
    namespace: str,
    name: str,
    label: str,
    node: str,
    bound_at: datetime | None = None,
    resource_version: str = "",
    warmth: str = "",
) -> bool:
    """Record that pod `pod_uid` was placed on `node`; count it if it is new.

    Returns True when the pod entered the ledger now (and every key of `label`,
    `labels.placement_keys`, was incremented on `node` in the same transaction),
    False when the UID was already in the ledger (nothing changes: the label is
    frozen at first observation). `enter_placement` also says the warmth and the
    history behind it.
    """
    entered = enter_placement(
        pod_uid=pod_uid,
        namespace=namespace,
        name=name,
        label=label,
        node=node,
        bound_at=bound_at,
        resource_version=resource_version,
        warmth=warmth,
    )
    return entered is not None


def enter_placement(
    *,
    pod_uid: str,
    namespace: str,
    name: str,
    label: str,
    node: str,
    bound_at: datetime | None = None,
    resource_version: str = "",
    warmth: str = "",
    depth: bool = False,
) -> Entered | None:
    """`record_placement`, returning what the watcher's Event says: the warmth and
    history of a pod entered now, None when its UID was already in the ledger.

    Three statements for a new pod, two for a known one, in the caller's
    transaction (or one of its own): the label-path history on the node (warmth is
    judged from history as it stood before this pod counted; `warm_history`), the
    ledger row (an insert that does nothing when the UID is already there, so a
    concurrent duplicate waits for the first and then changes nothing), and, only
    when the row went in, the increments of every key in one upsert. With `depth`,
    an exact placement reads the node's recent pipelines too (`workspace_depth`).
    """
    now = timezone.now()
    with transaction.atomic(savepoint=False):
        history = tuple(warm_history(label=label, node=node, at=now))
        warmth = warmth or warmth_of(label=label, history=history)
        exact = depth and warmth == Placement.Warmth.EXACT
        before = workspace_depth(label=label, node=node) if exact else None
        adapt = connection.ops.adapt_datetimefield_value
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {placement_table()} (pod_uid, namespace, name, "
                f"label, node, bound_at, resource_version, warmth, outcome) "
                f"VALUES (%s, %s, %s, %s, %s, %s, %s, %s, '') "
                f"ON CONFLICT (pod_uid) DO NOTHING",
                [
                    pod_uid,
                    namespace,
                    name,
                    label,
                    node,
                    adapt(bound_at or now),
                    resource_version,
                    warmth,
                ],
            )
            created = cursor.rowcount == 1
        if not created:
            return None
        increment_key_nodes(keys=placement_keys(label), node=node, now=now)
    return Entered(warmth=warmth, history=history, depth=before)


def workspace_depth(*, label: str, node: str) -> int | None:
    """How many other pipelines were placed on `node` since `label` last was, as
    `warm` reads it (`reader.depths`), from the statement the readers use."""
    key = pipeline_key(path_keys(label))
    if key is None:
        return None
    recent = read_recent([node]).get(node)
    return depth_in(recent.keys if recent is not None else (), key)


def finish_placement(*, pod_uid: str, finished_at: datetime | None = None) -> bool:
    """Mark a placement as ended (pod succeeded, failed or was deleted).

    Returns True if an active ledger row was closed now. Counts are cumulative and do
    not change. One statement.
    """
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {placement_table()} SET finished_at = %s "
            f"WHERE pod_uid = %s AND finished_at IS NULL",
            [adapt(finished_at or timezone.now()), pod_uid],
        )
        closed: bool = cursor.rowcount > 0
        return closed


@dataclass(frozen=True)
class RecordedOutcome:
    """A placement whose final phase was recorded now, with its stored times."""

    warmth: str
    outcome: str
    startup: float | None
    run: float | None


def record_outcome(
    *,
    pod_uid: str,
    startup: float | None,
    run: float | None,
    outcome: str,
) -> RecordedOutcome | None:
    """Record how long pod `pod_uid` took to start and run, and how it ended.

    The first observation that carries a value wins, as with counts: `startup` is
    stored while the row has none and has not ended; `outcome` (with `run`, which may
    be None) only while the row has no outcome. Replays, relists and restarts of the
    watcher therefore change nothing, and a pod without a ledger row is ignored.

    Returns the row's warmth, outcome and stored times when this call recorded the
    outcome, else None (nothing new, no outcome given, or no such placement).
    """
    if startup is None and not outcome:
        return None
    table = placement_table()
    with connection.cursor() as cursor:
        if not outcome:
            cursor.execute(
                f"UPDATE {table} SET startup_seconds = %s WHERE pod_uid = %s "
                f"AND startup_seconds IS NULL AND outcome = ''",
                [startup, pod_uid],
            )
            return None
        # One statement: the startup where the row has none, and the outcome, on a
        # row without an outcome; the stored values come back.
        cursor.execute(
            f"UPDATE {table} SET startup_seconds = CASE WHEN startup_seconds IS NULL "
            f"THEN %s ELSE startup_seconds END, outcome = %s, run_seconds = %s "
            f"WHERE pod_uid = %s AND outcome = '' RETURNING warmth, startup_seconds",
            [startup, outcome, run, pod_uid],
        )
        stored = cursor.fetchall()
    if not stored:
        return None
    warmth, stored_startup = stored[0]
    return RecordedOutcome(
        warmth=warmth, outcome=outcome, startup=stored_startup, run=run
    )


def classify_warmth(*, label: str, node: str, at: datetime | None = None) -> str:
    """How warm `node` is for a pod of pipeline `label`, from its label-path rows.

    "exact" when this very pipeline ran on the node, "partial" when a pipeline
    sharing a leading run of its segments did (`jenkins-java-*` for
    `jenkins-java-maven-app1`), "cold" otherwise (and for a pod without a label).
    A shared later segment under another prefix is not warmth. Which rows count:
    `warm_history`.
    """
    return warmth_of(label=label, history=warm_history(label=label, node=node, at=at))


def warmth_of(*, label: str, history: Sequence[tuple[str, int]]) -> str:
    """`classify_warmth` from the label's `warm_history` on the node, read before."""
    keys = path_keys(label)
    warm = {key for key, _ in history}
    if keys and keys[-1] in warm:
        return Placement.Warmth.EXACT
    if warm:
        return Placement.Warmth.PARTIAL
    return Placement.Warmth.COLD


def warm_history(
    *, label: str, node: str, at: datetime | None = None
) -> list[tuple[str, int]]:
    """(key, count) of the label-path keys that make `node` warm for `label` at
    `at` (default now), general to specific: the one home of what warmth counts.

    A row counts while its recency weight at `at` is at least
    `recency.WARM_MIN_WEIGHT`, as `warm` counts it; history from before a node
    replacement does not count. Read in the caller's transaction with the plain
    statement, never a cache, and only the node's rows (no running pods or
    policies), so the cost does not grow with what runs elsewhere.
    """
    keys = path_keys(label)
    if not keys:
        return []
    now = (at or timezone.now()).timestamp()
    history = SqlReader().node_history(keys=keys, node=node)
    counts = {
        key: count
        for key, count, weight, placed_at in history.rows_that_count(node)
        if weight_now(count=count, weight=weight, at=placed_at, now=now)
        >= WARM_MIN_WEIGHT
    }
    return [(key, counts[key]) for key in keys if key in counts]
