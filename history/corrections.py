"""Counts changed by hand: admin edits, bulk actions and imports.

Every change is recorded as a CountAdjustment in the same transaction, so
`audit_counts` still balances and the SQLite cache sees the change.

A count raised by hand counts as placements made at the moment of the edit: raising
it by d adds d to the row's recency weight valued now, exactly as the ledger adds
placements, so the `warm` scoring moves with the edit. Lowering a count keeps the
stored weight (the scoring caps a weight at its count).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from itertools import islice
from typing import NamedTuple, TypeVar

from django.db import connection, transaction
from django.db.models import F, QuerySet, Subquery
from django.utils import timezone

from history.ledger import add_counts_on_conflict
from history.models import MAX_COUNT, CountAdjustment, KeyNode
from history.sqlrows import rows_table

T = TypeVar("T")

# Rows per statement in bulk corrections. The rows travel as one parameter per
# column (an array on PostgreSQL, JSON on SQLite), so the statement's text stays
# short whatever the number of rows.
BULK_ROWS = 10_000
# Keys per query when reading the current counts of many pairs.
READ_BATCH = 500


# (key, node, number) rows as r(k, n, c): see `sqlrows.rows_table`.
KEY_NODE_NUMBER = (("k", "text"), ("n", "text"), ("c", "bigint"))


def _rows_table(
    rows: Sequence[tuple[str, str, int]],
) -> tuple[str, list[list[object]] | list[str]]:
    """SQL for `rows` of (key, node, number) as a table r(k, n, c), and its
    parameters (`sqlrows.rows_table`)."""
    return rows_table(rows, columns=KEY_NODE_NUMBER)


def _add_to_counts(*, added: Sequence[tuple[str, str, int]], now: datetime) -> None:
    """Add `by` (> 0) to KeyNode(key, node) for each (key, node, by), creating
    missing rows, as placements made at `now`.

    The stored weight is carried to the later of its instant and `now` and `by` is
    added valued there: the arithmetic of `ledger.increment_key_nodes` (a row
    without recency state starts from its count). `last_placed_at` is left alone:
    no pod was placed. Pairs must be distinct within `added`.
    """
    table = KeyNode._meta.db_table
    # Stored as the ORM stores it (SQLite: naive UTC text).
    stamp = connection.ops.adapt_datetimefield_value(now)
    update = add_counts_on_conflict(placed=False)
    # `WHERE true`: SQLite needs it to read ON CONFLICT after a SELECT.
    _write_batches(
        sql=f"INSERT INTO {table} (key, node, count, decayed_weight, decayed_at, "
        f"created, updated) "
        f"SELECT r.k, r.n, r.c, CAST(r.c AS DOUBLE PRECISION), "
        f"CAST(%s AS DOUBLE PRECISION), %s, %s FROM ({{rows}}) AS r "
        f"WHERE true {update}",
        params=[now.timestamp(), stamp, stamp],
        rows=added,
    )


def _write_batches(
    *, sql: str, params: list[float | str | None], rows: Sequence[tuple[str, str, int]]
) -> None:
    """Run `sql` once per BULK_ROWS of `rows`, with the batch as the table
    r(k, n, c) in place of its `{rows}` (`_rows_table`), after `params`."""
    with connection.cursor() as cursor:
        for start in range(0, len(rows), BULK_ROWS):
            batch, batch_params = _rows_table(rows[start : start + BULK_ROWS])
            cursor.execute(sql.replace("{rows}", batch), [*params, *batch_params])


def check_count(count: int) -> None:
    """Refuse a hand-written count outside 0..MAX_COUNT (or not an integer)."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise ValueError(f"count must be an integer, not {count!r}")
    if not 0 <= count <= MAX_COUNT:
        raise ValueError(f"count must be between 0 and {MAX_COUNT}, not {count}")


def set_key_node_count(
    *,
    key_node: KeyNode,
    count: int,
    actor: str,
    reason: str = "admin_edit",
    now: datetime | None = None,
) -> int:
    """Set a KeyNode count by hand and record the change as an adjustment.

    Returns the delta applied. The update is relative (`count + delta`) against the
    count read in the same transaction, so a placement recorded meanwhile is kept.
    A raise adds the delta to the recency weight as placements made at `now`
    (default: the moment of the edit); a cut keeps the stored weight.
    """
    check_count(count)
    now = now or timezone.now()
    with transaction.atomic():
        current = KeyNode.objects.filter(pk=key_node.pk).values_list("count", flat=True)
        old = current.first()
        if old is None:
            return 0
        delta = count - old
        if delta > 0:
            _add_to_counts(added=[(key_node.key, key_node.node, delta)], now=now)
        elif delta < 0:
            KeyNode.objects.filter(pk=key_node.pk).update(count=F("count") + delta)
        if delta:
            CountAdjustment.objects.create(
                key=key_node.key,
                node=key_node.node,
                delta=delta,
                reason=reason,
                actor=actor,
            )
    key_node.count = count
    return delta


def create_key_node(
    *, key: str, node: str, count: int, actor: str, now: datetime | None = None
) -> KeyNode:
    """Create a KeyNode row by hand, recording its count as an adjustment.

    Its recency weight is its count valued at `now` (default: the moment of the
    edit), as if that many placements were made then.
    """
    check_count(count)
    now = now or timezone.now()
    with transaction.atomic():
        key_node = KeyNode.objects.create(
            key=key,
            node=node,
            count=count,
            decayed_weight=float(count),
            decayed_at=now.timestamp(),
        )
        if count:
            CountAdjustment.objects.create(
                key=key,
                node=node,
                delta=count,
                reason=CountAdjustment.Reason.ADMIN_EDIT,
                actor=actor,
            )
    return key_node


class CountChange(NamedTuple):
    """One KeyNode row whose count a bulk correction changed."""

    pk: int
    key: str
    node: str
    old: int
    new: int


# (pk, key, node, count) of a selected KeyNode row.
SelectedRow = tuple[int, str, str, int]


def _locked_selection(
    key_nodes: QuerySet[KeyNode] | Iterable[KeyNode],
) -> Iterator[list[SelectedRow]]:
    """The rows of `key_nodes` that still exist, as stored now, BULK_ROWS at a time
    in primary-key order: one query per batch, whatever the selection's size.

    A QuerySet (the admin's selection, "select all" included) is read as a
    subquery; rows given one by one are looked up by primary key. Each batch is
    locked (PostgreSQL) and SQLite's IMMEDIATE transaction holds the write lock, so
    the counts read stay current until the caller's transaction ends.
    """
    locked = KeyNode.objects.select_for_update().order_by("pk")
    fields = ("pk", "key", "node", "count")
    if isinstance(key_nodes, QuerySet):
        # A sliced selection keeps its order: it decides which rows the slice holds.
        ids = key_nodes if key_nodes.query.is_sliced else key_nodes.order_by()
        selected = locked.filter(pk__in=Subquery(ids.values("pk")))
        after = 0
        while batch := list(
            selected.filter(pk__gt=after).values_list(*fields)[:BULK_ROWS]
        ):
            yield batch
            after = batch[-1][0]
        return
    pks = sorted({row.pk for row in key_nodes})
    for start in range(0, len(pks), BULK_ROWS):
        yield [
            row
            for chunk in _batches(pks[start : start + BULK_ROWS], READ_BATCH)
            for row in locked.filter(pk__in=chunk).values_list(*fields)
        ]


def delete_key_nodes(
    *, key_nodes: QuerySet[KeyNode] | Iterable[KeyNode], actor: str
) -> int:
    """Delete KeyNode rows by hand, recording the removed counts as adjustments.

    Set-based: per BULK_ROWS rows, one read, one DELETE and one INSERT of the
    adjustments. Returns the number of rows deleted.
    """
    now = timezone.now()
    deleted = 0
    with transaction.atomic():
        for batch in _locked_selection(key_nodes):
            rows = [(key, node, count) for _, key, node, count in batch]
            _delete_rows(rows=rows)
            _record_adjustments(
                deltas=[(key, node, -count) for key, node, count in rows if count],
                actor=actor,
                reason=CountAdjustment.Reason.DELETED,
                now=now,
            )
            deleted += len(rows)
    return deleted


def _rescale_key_nodes(
    *,
    key_nodes: QuerySet[KeyNode] | Iterable[KeyNode],
    actor: str,
    reason: str,
    target: Callable[[int], int],
    on_batch: Callable[[list[CountChange]], None] | None,
) -> int:
    """Set each row's count to `target(old)`, recording the deltas as adjustments.

    Set-based: per BULK_ROWS rows, one locked read, one relative UPDATE and one
    INSERT of the adjustments (the PostgreSQL change log's triggers and the SQLite
    cache, which follows the adjustments, see every row). `on_batch` is given the
    rows of each batch whose count changed (rows already at their target are
    skipped). Returns how many rows changed.
    """
    now = timezone.now()
    changed = 0
    with transaction.atomic():
        for batch in _locked_selection(key_nodes):
            changes = [
                CountChange(pk, key, node, old, target(old))
                for pk, key, node, old in batch
                if target(old) != old
            ]
            for change in changes:
                if not 0 <= change.new <= change.old:
                    raise ValueError(
                        f"a bulk action may only lower a count "
                        f"({change.old} -> {change.new})"
                    )
            deltas = [(c.key, c.node, c.new - c.old) for c in changes]
            _cut_counts(cut=deltas, now=now)
            _record_adjustments(deltas=deltas, actor=actor, reason=reason, now=now)
            if on_batch is not None and changes:
                on_batch(changes)
            changed += len(changes)
    return changed


def reset_key_nodes(
    *,
    key_nodes: QuerySet[KeyNode] | Iterable[KeyNode],
    actor: str,
    on_batch: Callable[[list[CountChange]], None] | None = None,
) -> int:
    """Set the counts of `key_nodes` to zero; returns how many rows changed
    (`on_batch` sees them, see `_rescale_key_nodes`)."""
    return _rescale_key_nodes(
        key_nodes=key_nodes,
        actor=actor,
        reason=CountAdjustment.Reason.RESET,
        target=lambda old: 0,
        on_batch=on_batch,
    )


def halve_key_nodes(
    *,
    key_nodes: QuerySet[KeyNode] | Iterable[KeyNode],
    actor: str,
    on_batch: Callable[[list[CountChange]], None] | None = None,
) -> int:
    """Halve the counts of `key_nodes` (rounding down): old history weighs less.

    Returns how many rows changed (`on_batch` sees them); a count of 0 stays 0.
    """
    return _rescale_key_nodes(
        key_nodes=key_nodes,
        actor=actor,
        reason=CountAdjustment.Reason.HALVED,
        target=lambda old: old // 2,
        on_batch=on_batch,
    )


def _batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """`items` in lists of at most `size`, taken as they come."""
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def add_key_node_counts(
    *,
    counts: Mapping[tuple[str, str], int],
    actor: str,
    reason: str,
    now: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Add counts to many (key, node) pairs at once, creating missing rows.

    Each count (> 0) counts as that many placements made at `now`, as an edit that
    raises a count does, and is recorded as one adjustment per pair; all in one
    transaction, written BULK_ROWS pairs at a time (`progress` is told how many
    pairs are written after each). Returns the number of pairs changed.
    """
    now = now or timezone.now()
    added = ((key, node, by) for (key, node), by in counts.items() if by > 0)
    changed = 0
    with transaction.atomic():
        for batch in _batches(added, BULK_ROWS):
            _add_to_counts(added=batch, now=now)
            _record_adjustments(deltas=batch, actor=actor, reason=reason, now=now)
            changed += len(batch)
            if progress is not None:
                progress(changed)
    return changed


def set_key_node_counts(
    *,
    counts: Mapping[tuple[str, str], int],
    actor: str,
    reason: str,
    now: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Set many (key, node) counts at once, creating missing rows.

    As for single edits, a raise counts as placements made at `now` and a cut keeps
    the stored weight; each change is recorded as one adjustment; all in one
    transaction, with the rows locked (PostgreSQL) or the write lock held (SQLite
    IMMEDIATE) between the read and the relative update. Pairs are taken BULK_ROWS
    at a time in key order (`progress` is told how many are done after each).
    Returns the number of pairs changed.
    """
    now = now or timezone.now()
    changed = done = 0
    with transaction.atomic():
        for batch in _batches(sorted(counts), BULK_ROWS):
            current = _current_counts(keys={key for key, _ in batch})
            deltas = [
                (key, node, counts[key, node] - current.get((key, node), 0))
                for key, node in batch
            ]
            raised = [delta for delta in deltas if delta[2] > 0]
            cut = [delta for delta in deltas if delta[2] < 0]
            _add_to_counts(added=raised, now=now)
            _cut_counts(cut=cut, now=now)
            _record_adjustments(
                deltas=raised + cut, actor=actor, reason=reason, now=now
            )
            changed += len(raised) + len(cut)
            done += len(batch)
            if progress is not None:
                progress(done)
    return changed


def current_counts(*, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The stored count of each of `pairs` that has a row (read only, no lock)."""
    wanted = set(pairs)
    found = _current_counts(keys={key for key, _ in wanted}, lock=False)
    return {pair: count for pair, count in found.items() if pair in wanted}


def _current_counts(*, keys: set[str], lock: bool = True) -> dict[tuple[str, str], int]:
    """{(key, node): count} for every row of `keys`, locked when `lock`."""
    ordered = sorted(keys)
    rows = KeyNode.objects.select_for_update() if lock else KeyNode.objects.all()
    found: dict[tuple[str, str], int] = {}
    for start in range(0, len(ordered), READ_BATCH):
        chunk = ordered[start : start + READ_BATCH]
        for key, node, count in rows.filter(key__in=chunk).values_list(
            "key", "node", "count"
        ):
            found[key, node] = count
    return found


def _cut_counts(*, cut: Sequence[tuple[str, str, int]], now: datetime) -> None:
    """Add each negative delta to its row's count; the stored weight is kept."""
    table = KeyNode._meta.db_table
    _write_batches(
        sql=f"UPDATE {table} SET count = {table}.count + r.c, updated = %s "
        f"FROM ({{rows}}) AS r WHERE {table}.key = r.k AND {table}.node = r.n",
        params=[connection.ops.adapt_datetimefield_value(now)],
        rows=cut,
    )


def _delete_rows(*, rows: Sequence[tuple[str, str, int]]) -> None:
    """Delete the KeyNode row of each (key, node, _)."""
    _write_batches(
        sql=f"DELETE FROM {KeyNode._meta.db_table} WHERE (key, node) IN "
        f"(SELECT r.k, r.n FROM ({{rows}}) AS r)",
        params=[],
        rows=rows,
    )


def _record_adjustments(
    *,
    deltas: Sequence[tuple[str, str, int]],
    actor: str,
    reason: str,
    now: datetime,
) -> None:
    """Insert one adjustment per (key, node, delta), many rows per statement (the
    ORM's bulk_create spends most of a large import preparing values)."""
    stamp = connection.ops.adapt_datetimefield_value(now)
    _write_batches(
        sql=f"INSERT INTO {CountAdjustment._meta.db_table} "
        f"(key, node, delta, reason, actor, created) "
        f"SELECT r.k, r.n, r.c, %s, %s, %s FROM ({{rows}}) AS r",
        params=[reason, actor, stamp],
        rows=deltas,
    )
