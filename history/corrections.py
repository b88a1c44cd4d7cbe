"""Counts changed by hand: admin edits, bulk actions and imports.

Every change is recorded as a CountAdjustment in the same transaction, so
`audit_counts` still balances and the SQLite cache sees the change.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.models import F

from history.models import MAX_COUNT, CountAdjustment, KeyNode


def check_count(count: int) -> None:
    """Refuse a hand-written count outside 0..MAX_COUNT (or not an integer)."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise ValueError(f"count must be an integer, not {count!r}")
    if not 0 <= count <= MAX_COUNT:
        raise ValueError(f"count must be between 0 and {MAX_COUNT}, not {count}")


def set_key_node_count(
    *, key_node: KeyNode, count: int, actor: str, reason: str = "admin_edit"
) -> int:
    """Set a KeyNode count by hand and record the change as an adjustment.

    Returns the delta applied. The update is relative (`count + delta`) against the
    count read in the same transaction, so a placement recorded meanwhile is kept.
    """
    check_count(count)
    with transaction.atomic():
        current = KeyNode.objects.filter(pk=key_node.pk).values_list("count", flat=True)
        old = current.first()
        if old is None:
            return 0
        delta = count - old
        if delta:
            KeyNode.objects.filter(pk=key_node.pk).update(count=F("count") + delta)
            CountAdjustment.objects.create(
                key=key_node.key,
                node=key_node.node,
                delta=delta,
                reason=reason,
                actor=actor,
            )
    key_node.count = count
    return delta


def create_key_node(*, key: str, node: str, count: int, actor: str) -> KeyNode:
    """Create a KeyNode row by hand, recording its count as an adjustment."""
    check_count(count)
    with transaction.atomic():
        key_node = KeyNode.objects.create(key=key, node=node, count=count)
        if count:
            CountAdjustment.objects.create(
                key=key,
                node=node,
                delta=count,
                reason=CountAdjustment.Reason.ADMIN_EDIT,
                actor=actor,
            )
    return key_node


def delete_key_nodes(*, key_nodes: Iterable[KeyNode], actor: str) -> int:
    """Delete KeyNode rows by hand, recording the removed counts as adjustments.

    Returns the number of rows deleted.
    """
    deleted = 0
    with transaction.atomic():
        for key_node in key_nodes:
            count = (
                KeyNode.objects.filter(pk=key_node.pk)
                .values_list("count", flat=True)
                .first()
            )
            if count is None:
                continue
            KeyNode.objects.filter(pk=key_node.pk).delete()
            if count:
                CountAdjustment.objects.create(
                    key=key_node.key,
                    node=key_node.node,
                    delta=-count,
                    reason=CountAdjustment.Reason.DELETED,
                    actor=actor,
                )
            deleted += 1
    return deleted


def _rescale_key_nodes(
    *, key_nodes: Iterable[KeyNode], actor: str, reason: str, target
) -> list[tuple[KeyNode, int, int]]:
    """Set each row's count to `target(old)`, recording the deltas as adjustments.

    Returns (row, old, new) for each row whose count changed. The row is locked
    (PostgreSQL) or the write lock is held (SQLite IMMEDIATE) between the read and
    the relative update, so a concurrent placement is never lost.
    """
    changed = []
    with transaction.atomic():
        for key_node in key_nodes:
            old = (
                KeyNode.objects.select_for_update()
                .filter(pk=key_node.pk)
                .values_list("count", flat=True)
                .first()
            )
            if old is None:
                continue
            new = target(old)
            if not 0 <= new <= old:
                raise ValueError(
                    f"a bulk action may only lower a count ({old} -> {new})"
                )
            if new == old:
                continue
            KeyNode.objects.filter(pk=key_node.pk).update(count=F("count") + new - old)
            CountAdjustment.objects.create(
                key=key_node.key,
                node=key_node.node,
                delta=new - old,
                reason=reason,
                actor=actor,
            )
            key_node.count = new
            changed.append((key_node, old, new))
    return changed


def reset_key_nodes(
    *, key_nodes: Iterable[KeyNode], actor: str
) -> list[tuple[KeyNode, int, int]]:
    """Set the counts of `key_nodes` to zero; returns (row, old, 0) per changed row."""
    return _rescale_key_nodes(
        key_nodes=key_nodes,
        actor=actor,
        reason=CountAdjustment.Reason.RESET,
        target=lambda old: 0,
    )


def halve_key_nodes(
    *, key_nodes: Iterable[KeyNode], actor: str
) -> list[tuple[KeyNode, int, int]]:
    """Halve the counts of `key_nodes` (rounding down): old history weighs less.

    Returns (row, old, new) per changed row; a count of 0 stays 0.
    """
    return _rescale_key_nodes(
        key_nodes=key_nodes,
        actor=actor,
        reason=CountAdjustment.Reason.HALVED,
        target=lambda old: old // 2,
    )
