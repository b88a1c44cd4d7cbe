"""Proving counts and trimming history: `audit_counts`, `prune_placements` and
`prune_nodes`.

Every KeyNode count equals its ledger rows plus its recorded adjustments; pruning
ledger rows records a `pruned` adjustment, and removing the rows of a gone node a
`node_gone` one, so that this stays true.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Count, Q, Sum

from history.labels import placement_keys
from history.models import CountAdjustment, KeyNode, Placement
from history.reader.pool import read_pool


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

    Returns (number of (key, node) pairs checked, drifts). Reads in one
    transaction, so a placement committed meanwhile cannot show up as drift.
    """
    placements: dict[tuple[str, str], int] = {}
    adjustments: dict[tuple[str, str], int] = {}
    counts: dict[tuple[str, str], int] = {}
    with transaction.atomic():
        for label, node, rows in (
            Placement.objects.values_list("label", "node")
            .annotate(rows=Count("id"))
            .order_by()
        ):
            for key in placement_keys(label):
                placements[key, node] = placements.get((key, node), 0) + rows
        for key, node, total in (
            CountAdjustment.objects.values_list("key", "node")
            .annotate(total=Sum("delta"))
            .order_by()
        ):
            adjustments[key, node] = total or 0
        for key, node, count in KeyNode.objects.values_list("key", "node", "count"):
            counts[key, node] = count
    pairs = set(placements) | set(adjustments) | set(counts)
    drifts = [
        Drift(
            key=key,
            node=node,
            count=counts.get((key, node), 0),
            placements=placements.get((key, node), 0),
            adjustments=adjustments.get((key, node), 0),
        )
        for key, node in sorted(pairs)
    ]
    return len(pairs), [d for d in drifts if d.difference]


def prunable_placements(*, before: datetime, include_unfinished: bool = False):
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
    when `include_unfinished` and they were bound before `before`. Returns the
    number of rows deleted.
    """
    with transaction.atomic():
        rows = prunable_placements(before=before, include_unfinished=include_unfinished)
        removed: dict[tuple[str, str], int] = {}
        for label, node, number in (
            rows.values_list("label", "node").annotate(number=Count("id")).order_by()
        ):
            for key in placement_keys(label):
                removed[key, node] = removed.get((key, node), 0) + number
        deleted, _ = rows.delete()
        CountAdjustment.objects.bulk_create(
            CountAdjustment(
                key=key,
                node=node,
                delta=number,
                reason=CountAdjustment.Reason.PRUNED,
                actor=actor,
            )
            for (key, node), number in sorted(removed.items())
        )
    return deleted


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
