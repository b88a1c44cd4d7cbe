"""Proving counts and trimming history: `audit_counts`, `prune_placements` and
`prune_nodes`.

Every KeyNode count equals its ledger rows plus its recorded adjustments; pruning
ledger rows records a `pruned` adjustment, and removing the rows of a gone node a
`node_gone` one, so that this stays true.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from history.labels import placement_keys
from history.models import CountAdjustment, KeyNode, Placement
from history.reader.pool import read_pool
from history.replay import PAGE


@dataclass(frozen=True)
class Drift:
    """A KeyNode count that does not match its ledger rows plus adjustments."""

    key: str
    node: str
    count: int
    placements: int
    adjustments: int

    @property
    def expected(self) -> int:
        return self.placements + self.adjustments

    @property
    def difference(self) -> int:
        return self.count - self.expected


def audit_counts() -> tuple[int, list[Drift]]:
    """Compare every KeyNode count with ledger rows + recorded adjustments.

    Returns (number of (key, node) pairs checked, drifts). It goes one node at a
    time (each read served by an index on the node), so memory is that of one
    node's pairs and the drifts, whatever the history's size. A placement changes
    the rows of one node only, and each node is read in one short transaction, so
    a placement committed meanwhile cannot show up as drift, and the watcher
    waits for no more than one node's reads.
    """
    checked = 0
    drifts: list[Drift] = []
    for node in _audited_nodes():
        with transaction.atomic():
            found = _node_drifts(node)
        checked += found[0]
        drifts.extend(found[1])
    drifts.sort(key=lambda d: (d.key, d.node))
    return checked, drifts


def _node_drifts(node: str) -> tuple[int, list[Drift]]:
    """`audit_counts` for the pairs of one node."""
    placements: dict[str, int] = {}
    for label, rows in (
        Placement.objects.filter(node=node)
        .values_list("label")
        .annotate(rows=Count("id"))
        .order_by()
    ):
        for key in placement_keys(label):
            placements[key] = placements.get(key, 0) + rows
    adjustments = dict(
        CountAdjustment.objects.filter(node=node)
        .values_list("key")
        .annotate(total=Sum("delta"))
        .order_by()
    )
    counts = dict(KeyNode.objects.filter(node=node).values_list("key", "count"))
    keys = sorted(set(placements) | set(adjustments) | set(counts))
    drifts = [
        Drift(
            key=key,
            node=node,
            count=counts.get(key, 0),
            placements=placements.get(key, 0),
            adjustments=adjustments.get(key) or 0,
        )
        for key in keys
    ]
    return len(keys), [drift for drift in drifts if drift.difference]


def _audited_nodes() -> Iterator[str]:
    """Every node with ledger rows, adjustments or counts, in name order: the next
    one after the last is the least of each table's next (three indexed reads)."""
    tables = (Placement.objects, CountAdjustment.objects, KeyNode.objects)
    last: str | None = None
    while True:
        found = [
            (manager if last is None else manager.filter(node__gt=last))
            .order_by("node")
            .values_list("node", flat=True)
            .first()
            for manager in tables
        ]
        nodes = [node for node in found if node is not None]
        if not nodes:
            return
        last = min(nodes)
        yield last


def prunable_placements(
    *, before: datetime, include_unfinished: bool = False
) -> QuerySet[Placement]:
    """The ledger rows `prune_placements` would delete (a QuerySet)."""
    condition = Q(finished_at__lt=before)
    if include_unfinished:
        condition |= Q(finished_at__isnull=True, bound_at__lt=before)
    return Placement.objects.filter(condition)


def prune_placements(
    *, before: datetime, include_unfinished: bool = False, actor: str = ""
) -> int:
    """Delete ledger rows that ended before `before`; counts do not change.

    Each (key, node) gets a `pruned` adjustment equal to the rows removed, so the
    audit still balances. Unfinished rows (pods never seen to end) are pruned too
    when `include_unfinished` and they were bound before `before`. Rows go `PAGE`
    at a time in node order, each page with its adjustments in one transaction, so
    memory and the length of a transaction do not grow with the ledger. Returns
    the number of rows deleted.
    """
    rows = prunable_placements(before=before, include_unfinished=include_unfinished)
    deleted = 0
    after: tuple[str, int] | None = None
    while True:
        page = rows.order_by("node", "pk")
        if after is not None:
            page = page.filter(Q(node__gt=after[0]) | Q(node=after[0], pk__gt=after[1]))
        with transaction.atomic():
            found = list(page.values_list("node", "pk", "label")[:PAGE])
            if not found:
                return deleted
            removed: dict[tuple[str, str], int] = {}
            for node, _, label in found:
                for key in placement_keys(label):
                    removed[key, node] = removed.get((key, node), 0) + 1
            deleted += Placement.objects.filter(
                pk__in=[pk for _, pk, _ in found]
            ).delete()[0]
            _add_adjustments(
                sorted(removed.items()),
                reason=CountAdjustment.Reason.PRUNED,
                actor=actor,
            )
        after = found[-1][0], found[-1][1]


def _add_adjustments(
    changes: list[tuple[tuple[str, str], int]], *, reason: str, actor: str
) -> None:
    """Insert one adjustment per ((key, node), delta), PAGE rows per statement and
    no model instances: the ORM's per-field preparation made a large prune slow."""
    adapt = connection.ops.adapt_datetimefield_value
    now = adapt(timezone.now())
    table = connection.ops.quote_name(CountAdjustment._meta.db_table)
    sql = (
        f"INSERT INTO {table} (key, node, delta, reason, actor, created) "
        "VALUES (%s, %s, %s, %s, %s, %s)"
    )
    rows = [(key, node, delta, reason, actor, now) for (key, node), delta in changes]
    with connection.cursor() as cursor:
        for start in range(0, len(rows), PAGE):
            cursor.executemany(sql, rows[start : start + PAGE])


def gone_nodes(*, before: datetime) -> list[str]:
    """Nodes with history that have been out of the pipeline pool since `before`:
    no row of theirs placed or edited since, and not first seen or replaced by the
    watcher since (`history.reader.pool.read_pool`). Sorted."""
    cutoff = before.timestamp()
    active = set(read_pool(cutoff))
    active.update(
        KeyNode.objects.filter(updated__gte=before)
        .order_by()
        .values_list("node", flat=True)
        .distinct()
    )
    with_rows = set(
        KeyNode.objects.order_by().values_list("node", flat=True).distinct()
    )
    return sorted(with_rows - active)


def prune_gone_nodes(*, before: datetime, actor: str = "", batch: int = 500) -> int:
    """Delete the KeyNode rows of nodes gone since `before` (`gone_nodes`); returns
    how many rows went. Each row gets a `node_gone` adjustment of minus its count,
    so `audit_counts` still balances (the ledger keeps the placements, the
    adjustments what was removed). Nodes are done `batch` at a time, each batch in
    its own transaction."""
    nodes = gone_nodes(before=before)
    removed = 0
    for start in range(0, len(nodes), batch):
        chunk = nodes[start : start + batch]
        with transaction.atomic():
            rows = KeyNode.objects.select_for_update().filter(
                node__in=chunk, updated__lt=before
            )
            found = list(rows.values_list("pk", "key", "node", "count"))
            CountAdjustment.objects.bulk_create(
                CountAdjustment(
                    key=key,
                    node=node,
                    delta=-count,
                    reason=CountAdjustment.Reason.NODE_GONE,
                    actor=actor,
                )
                for _, key, node, count in found
                if count
            )
            KeyNode.objects.filter(pk__in=[pk for pk, *_ in found]).delete()
            removed += len(found)
    return removed
