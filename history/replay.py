"""Passes over the whole placement ledger in bounded memory: replaying it into
label-path rows (migrations 0013 and 0015) and the node-by-node reads the audit and
pruning use.

The ledger can hold millions of rows, so no pass holds it, or a dict of every (key,
node) pair it implies. A pass reads it one node at a time (`ledger_nodes`), and a
node's rows in pages of `PAGE` in the order they were bound (`node_ledger`). Both are
keyset paginations: every page is a new, short query, so the caller may write
between pages, on SQLite too (whose cursors see their own connection's writes). The
recency arithmetic needs the state of every (key, node) pair, but the rows of one
node never touch another node's, so a replay keeps only one node's path rows
(`NodePaths`) and writes them before it moves to the next node. Memory is that of one
page plus one node's distinct path keys, whatever the history's size.

The functions take the models as arguments, so migrations pass their historical
models.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Q, Sum
from django.utils import timezone

from history.labels import (
    InvalidLabels,
    is_valid_label_value,
    key_kind,
    path_keys,
    placement_keys,
)
from history.recency import WARM_MIN_WEIGHT, accumulate_decayed, decayed_weight

logger = logging.getLogger(__name__)

# Ledger rows per page, KeyNode rows per insert and pks per warmth update.
PAGE = 2000


def ledger_nodes(placements: Any) -> Iterator[str]:
    """The distinct nodes of `placements` (a Placement QuerySet), in name order,
    one indexed query per node."""
    last: str | None = None
    while True:
        rows = placements if last is None else placements.filter(node__gt=last)
        node = rows.order_by("node").values_list("node", flat=True).first()
        if node is None:
            return
        yield node
        last = node


def node_ledger(
    placements: Any, *, node: str, fields: Iterable[str], page: int = PAGE
) -> Iterator[tuple[Any, ...]]:
    """`(pk, bound_at, *fields)` of the rows of `placements` on `node`, in the order
    they were bound (then by pk), `page` rows per query."""
    rows = (
        placements.filter(node=node)
        .order_by("bound_at", "pk")
        .values_list("pk", "bound_at", *fields)
    )
    after: tuple[Any, ...] | None = None
    while True:
        query = rows
        if after is not None:
            query = rows.filter(
                Q(bound_at__gt=after[1]) | Q(bound_at=after[1], pk__gt=after[0])
            )
        found = list(query[:page])
        yield from found
        if len(found) < page:
            return
        after = found[-1]


@dataclass
class PathRow:
    """One (key, node) path row as the ledger's upsert builds it."""

    count: int
    weight: float
    at: float
    last: datetime


@dataclass
class NodePaths:
    """The path rows of one node while its ledger is replayed in bind order.

    `replaced` is when the node was last replaced (Unix seconds), or None: rows last
    placed before it do not make the node warm afterwards (the replacement rule
    `ledger.classify_warmth` applies).
    """

    half_life: float
    replaced: float | None = None
    rows: dict[str, PathRow] = field(default_factory=dict)

    def judge(self, label: str, at: float) -> str:
        """The warmth of a placement of `label` at `at` from the rows before it:
        exact, partial or cold (`ledger.classify_warmth`)."""
        keys = path_keys(label)
        warm = {key for key in keys if self._is_warm(key, at)}
        if keys and keys[-1] in warm:
            return "exact"
        return "partial" if warm else "cold"

    def _is_warm(self, key: str, at: float) -> bool:
        row = self.rows.get(key)
        if row is None:
            return False
        if self.replaced is not None and row.last.timestamp() < self.replaced <= at:
            return False
        weight = decayed_weight(
            weight=row.weight, at=row.at, now=at, half_life=self.half_life
        )
        return min(weight, row.count) >= WARM_MIN_WEIGHT

    def add(self, key: str, bound_at: datetime) -> None:
        """Count one placement at `bound_at` under `key`, as the ledger's upsert
        does (`recency.accumulate_decayed`)."""
        at = bound_at.timestamp()
        row = self.rows.get(key)
        if row is None:
            self.rows[key] = PathRow(1, 1.0, at, bound_at)
            return
        row.weight, row.at = accumulate_decayed(
            weight=row.weight, at=row.at, add=1.0, add_at=at, half_life=self.half_life
        )
        row.count += 1
        row.last = max(row.last, bound_at)


def rebuild_path_rows(
    *,
    Placement: Any,
    KeyNode: Any,
    NodeRecord: Any,
    CountAdjustment: Any = None,
    half_life: float,
    only_keys: set[str] | None = None,
    judge_warmth: bool = False,
    what: str = "rebuild",
) -> InvalidLabels:
    """Write the label-path KeyNode rows again from the ledger, node by node.

    With `only_keys` None, every path row is rebuilt; otherwise only the rows of
    those keys. Existing rows of the rebuilt keys are deleted first. With
    `CountAdjustment`, each rebuilt row's count also carries the adjustments of its
    (key, node), so `audit_counts` balances (a pair left at zero or less gets no
    row). With `judge_warmth`, each ledger row's warmth is judged again from the
    path history before it. Rows whose label is not a valid label value are skipped
    (and counted in what is returned). Memory: one page and one node's path rows.
    """
    is_rebuilt: Callable[[str], bool] = (
        (lambda key: key_kind(key) != "segment")
        if only_keys is None
        else only_keys.__contains__
    )
    _delete_rows(KeyNode, only_keys)
    skipped = InvalidLabels()
    warmth: dict[str, list[int]] = {}
    replaced = dict(
        NodeRecord.objects.filter(
            replacements__gt=0, history_since__isnull=False
        ).values_list("name", "history_since")
    )
    for node in ledger_nodes(Placement.objects.all()):
        since = replaced.get(node)
        paths = NodePaths(half_life, since.timestamp() if since else None)
        for pk, bound_at, label, before in node_ledger(
            Placement.objects.all(), node=node, fields=("label", "warmth")
        ):
            if not is_valid_label_value(label):
                if skipped.is_first(label):
                    logger.warning(
                        "%s: skipped the ledger rows of label %.80r (%d characters): "
                        "not a valid Kubernetes label value",
                        what,
                        label,
                        len(label),
                    )
                continue
            if judge_warmth:
                judged = paths.judge(label, bound_at.timestamp())
                if judged != before:
                    pks = warmth.setdefault(judged, [])
                    pks.append(pk)
                    if len(pks) >= PAGE:
                        Placement.objects.filter(pk__in=pks).update(warmth=judged)
                        pks.clear()
            for key in placement_keys(label):
                if is_rebuilt(key):
                    paths.add(key, bound_at)
        _write_node(KeyNode, CountAdjustment, node, paths.rows, only_keys)
    for judged, pks in warmth.items():
        if pks:
            Placement.objects.filter(pk__in=pks).update(warmth=judged)
    if only_keys is not None and CountAdjustment is not None:
        _write_adjusted_only(KeyNode, CountAdjustment, only_keys, Placement)
    if skipped.rows:
        logger.warning(
            "%s: skipped %d ledger rows of %s%d labels that are not valid label values",
            what,
            skipped.rows,
            "at least " if len(skipped.named) >= skipped.limit else "",
            len(skipped.named),
        )
    return skipped


def _delete_rows(KeyNode: Any, only_keys: set[str] | None) -> None:
    if only_keys is None:
        pipeline, prefix = Q(key__endswith="$"), Q(key__endswith="-*")
        KeyNode.objects.filter(pipeline | prefix).delete()
        return
    keys = sorted(only_keys)
    for start in range(0, len(keys), PAGE):
        KeyNode.objects.filter(key__in=keys[start : start + PAGE]).delete()


def _adjustments(CountAdjustment: Any, node: str, keys: list[str]) -> dict[str, int]:
    """The summed adjustments of (key, node) for `keys` on `node`."""
    totals: dict[str, int] = {}
    for start in range(0, len(keys), PAGE):
        for key, total in (
            CountAdjustment.objects.filter(
                node=node, key__in=keys[start : start + PAGE]
            )
            .values_list("key")
            .annotate(total=Sum("delta"))
            .order_by()
        ):
            totals[key] = total or 0
    return totals


def _write_node(
    KeyNode: Any,
    CountAdjustment: Any,
    node: str,
    rows: dict[str, PathRow],
    only_keys: set[str] | None,
) -> None:
    """Insert one node's rebuilt rows, with their adjustments when asked.

    One multi-row statement per PAGE rows, without model instances: the ORM's
    per-field preparation took most of a replay's time."""
    adjusted: dict[str, int] = {}
    if CountAdjustment is not None and only_keys is not None:
        adjusted = _adjustments(CountAdjustment, node, sorted(rows))
    connection = connections[KeyNode.objects.db]
    adapt = connection.ops.adapt_datetimefield_value
    # `created` and `updated` are now, as a save would set them: a node gone long
    # ago keeps its new rows until `prune_nodes` finds it gone again.
    now = adapt(timezone.now())
    made = []
    for key, row in rows.items():
        count = row.count + adjusted.get(key, 0)
        if count > 0:
            made.append(
                (key, node, count, row.weight, row.at, adapt(row.last), now, now)
            )
    table = connection.ops.quote_name(KeyNode._meta.db_table)
    columns = "key, node, count, decayed_weight, decayed_at, last_placed_at, "
    sql = (
        f"INSERT INTO {table} ({columns}created, updated) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
    )
    with connection.cursor() as cursor:
        for start in range(0, len(made), PAGE):
            cursor.executemany(sql, made[start : start + PAGE])


def _write_adjusted_only(
    KeyNode: Any, CountAdjustment: Any, only_keys: set[str], Placement: Any
) -> None:
    """Rows of rebuilt keys that only adjustments hold (their placements pruned):
    the count the adjustments say, weighed as a hand edit (its count), so the
    audit balances."""
    keys = sorted(only_keys)
    for start in range(0, len(keys), PAGE):
        chunk = keys[start : start + PAGE]
        have = set(KeyNode.objects.filter(key__in=chunk).values_list("key", "node"))
        for key, node, total in (
            CountAdjustment.objects.filter(key__in=chunk)
            .values_list("key", "node")
            .annotate(total=Sum("delta"))
            .order_by()
        ):
            if (key, node) in have or not total or total <= 0:
                continue
            KeyNode.objects.create(
                key=key, node=node, count=total, decayed_weight=float(total)
            )
