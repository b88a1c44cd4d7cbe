"""Reads and writes of pipeline history that more than one caller needs.

The watcher, the admin, the management commands and the extender go through these
functions instead of repeating ORM code. Counts only ever move through atomic SQL
(`count = count + n`), never read-modify-write in Python.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson
from django.db import connection, transaction
from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from history.models import (
    CountAdjustment,
    KeyNode,
    NodeRecord,
    Placement,
    WatchState,
)

logger = logging.getLogger(__name__)

# Counts beyond this add nothing to any score (the seed formula caps at 10), so the
# best-match query clamps them to keep its packed integer small.
_COUNT_CLAMP = 999_999
_PACK = _COUNT_CLAMP + 1


def split_pipeline_label(value: str | None) -> list[str]:
    """Return the keys of a pipeline label value, from general to specific.

    `jenkins-java-maven-1` gives `["jenkins", "java", "maven", "1"]`; empty segments
    (`a--b`, a trailing `-`) are ignored. None or "" gives [].
    """
    if not value:
        return []
    return [segment for segment in value.split("-") if segment]


def increment_key_nodes(
    *, keys: Iterable[str], node: str, by: int = 1, now: datetime | None = None
) -> None:
    """Add `by` to KeyNode(key, node) for every key, creating missing rows.

    One statement: an upsert whose update adds to the stored count (qualified with the
    table name, as PostgreSQL requires). Safe against concurrent writers on both
    backends; duplicate keys in `keys` are counted once.
    """
    unique_keys = list(dict.fromkeys(keys))
    if not unique_keys:
        return
    now = now or timezone.now()
    table = KeyNode._meta.db_table
    rows = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(unique_keys))
    params: list = []
    for key in unique_keys:
        params += [key, node, by, now, now, now]
    sql = (
        f"INSERT INTO {table} (key, node, count, last_placed_at, created, updated) "
        f"VALUES {rows} "
        f"ON CONFLICT (key, node) DO UPDATE SET "
        f"count = {table}.count + excluded.count, "
        f"last_placed_at = excluded.last_placed_at, updated = excluded.updated"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


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

    Returns True when the pod entered the ledger now (and every segment of `label`
    was incremented on `node` in the same transaction), False when the UID was already
    in the ledger (nothing changes: the label is frozen at first observation).
    """
    keys = split_pipeline_label(label)
    now = timezone.now()
    with transaction.atomic():
        # get_or_create runs its INSERT in a savepoint, so a concurrent duplicate's
        # IntegrityError does not poison this transaction.
        _, created = Placement.objects.get_or_create(
            pod_uid=pod_uid,
            defaults={
                "namespace": namespace,
                "name": name,
                "label": label,
                "node": node,
                "bound_at": bound_at or now,
                "resource_version": resource_version,
                "warmth": warmth,
            },
        )
        if created:
            increment_key_nodes(keys=keys, node=node, now=now)
    return created


def finish_placement(*, pod_uid: str, finished_at: datetime | None = None) -> bool:
    """Mark a placement as ended (pod succeeded, failed or was deleted).

    Returns True if an active ledger row was closed now. Counts are cumulative and do
    not change.
    """
    closed = Placement.objects.filter(pod_uid=pod_uid, finished_at__isnull=True).update(
        finished_at=finished_at or timezone.now()
    )
    return bool(closed)


def set_key_node_count(
    *, key_node: KeyNode, count: int, actor: str, reason: str = "admin_edit"
) -> int:
    """Set a KeyNode count by hand and record the change as an adjustment.

    Returns the delta applied. The update is relative (`count + delta`) against the
    count read in the same transaction, so a placement recorded meanwhile is kept.
    """
    if count < 0:
        raise ValueError("count must be >= 0")
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


def best_matches(
    *, keys: Sequence[str], nodes: Sequence[str]
) -> dict[str, tuple[int, int]]:
    """For each node with history, the most specific of `keys` it has and that count.

    `keys` run from general to specific. Returns {node: (index into keys, count)} for
    the nodes among `nodes` that have a row with count > 0 for any key; counts are
    clamped at 999999. One query, one row per node: the database picks the most
    specific key per node, so no per-row work is left to Python.
    """
    if not keys or not nodes:
        return {}
    table = KeyNode._meta.db_table
    # Later occurrences win: a segment repeated in a label counts at its most
    # specific position.
    positions = {key: index for index, key in enumerate(keys)}
    case = " ".join("WHEN %s THEN %s" for _ in positions)
    case_params: list = []
    for key, index in positions.items():
        case_params += [key, index]
    key_marks = ", ".join(["%s"] * len(positions))
    if connection.vendor == "postgresql":
        node_filter = "node = ANY(%s)"
        node_param: object = list(nodes)
    else:
        node_filter = "node IN (SELECT value FROM json_each(%s))"
        node_param = orjson.dumps(list(nodes)).decode()
    sql = (
        f"SELECT node, MAX((CASE key {case} END) * {_PACK} + "
        f"CASE WHEN count > {_COUNT_CLAMP} THEN {_COUNT_CLAMP} ELSE count END) "
        f"FROM {table} WHERE key IN ({key_marks}) AND count > 0 AND {node_filter} "
        f"GROUP BY node"
    )
    params = [*case_params, *positions, node_param]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return {node: divmod(packed, _PACK) for node, packed in rows}


def create_key_node(*, key: str, node: str, count: int, actor: str) -> KeyNode:
    """Create a KeyNode row by hand, recording its count as an adjustment."""
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


# --- Watcher checkpoint, node identity, audit and pruning ---------------------------


def save_watch_state(
    *,
    name: str,
    resource_version: str | None = None,
    events: int = 0,
    relisted: bool = False,
    holder: str | None = None,
    now: datetime | None = None,
) -> None:
    """Record progress of watch stream `name` ('pods' or 'nodes').

    Call inside the transaction that holds the effects of the events, so the resume
    resourceVersion never runs ahead of what is committed. `events` adds to the
    event total (and sets last_event_at), `relisted` adds one relist; heartbeat_at is
    always set.
    """
    now = now or timezone.now()
    WatchState.objects.get_or_create(name=name)
    changes: dict = {"heartbeat_at": now, "updated": now}
    if resource_version:
        changes["resource_version"] = resource_version
    if events:
        changes["events"] = F("events") + events
        changes["last_event_at"] = now
    if relisted:
        changes["relists"] = F("relists") + 1
    if holder is not None:
        changes["holder"] = holder
    WatchState.objects.filter(name=name).update(**changes)


def checkpoint(*, name: str) -> str:
    """The resourceVersion stream `name` resumes from ("" when there is none)."""
    value = (
        WatchState.objects.filter(name=name)
        .values_list("resource_version", flat=True)
        .first()
    )
    return value or ""


def record_node_seen(*, name: str, uid: str, now: datetime | None = None) -> str:
    """Remember which UID node `name` has; a new UID means the node was replaced.

    Returns "new" (first time), "same" or "replaced". On a replacement
    `history_since` moves to now and `replacements` goes up by one, so history
    from before the replacement can be ignored.
    """
    now = now or timezone.now()
    with transaction.atomic():
        record, created = NodeRecord.objects.get_or_create(
            name=name, defaults={"uid": uid}
        )
        if created:
            return "new"
        if record.uid == uid:
            return "same"
        NodeRecord.objects.filter(pk=record.pk, uid=record.uid).update(
            uid=uid,
            history_since=now,
            replacements=F("replacements") + 1,
            updated=now,
        )
    return "replaced"


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
            for key in dict.fromkeys(split_pipeline_label(label)):
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


def prune_placements(
    *, before: datetime, include_unfinished: bool = False, actor: str = ""
) -> int:
    """Delete ledger rows that ended before `before`; counts do not change.

    Each (key, node) gets a `pruned` adjustment equal to the rows removed, so the
    audit still balances. Unfinished rows (pods never seen to end) are pruned too
    when `include_unfinished` and they were bound before `before`. Returns the
    number of rows deleted.
    """
    condition = Q(finished_at__lt=before)
    if include_unfinished:
        condition |= Q(finished_at__isnull=True, bound_at__lt=before)
    with transaction.atomic():
        rows = Placement.objects.filter(condition)
        removed: dict[tuple[str, str], int] = {}
        for label, node, number in (
            rows.values_list("label", "node").annotate(number=Count("id")).order_by()
        ):
            for key in dict.fromkeys(split_pipeline_label(label)):
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
