"""Reads and writes of pipeline history that more than one caller needs.

The watcher, the admin, the management commands and the extender go through these
functions instead of repeating ORM code. Counts only ever move through atomic SQL
(`count = count + n`), never read-modify-write in Python.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import Count, F, Max, Q, Sum
from django.utils import timezone

from history.models import (
    CountAdjustment,
    KeyNode,
    KeyPolicy,
    NodePolicy,
    NodeRecord,
    Placement,
    WatchState,
)

logger = logging.getLogger(__name__)

# Counts beyond this add nothing to any score (the seed formula caps at 10), so the
# best-match query clamps them to keep its packed integer small.
_COUNT_CLAMP = 999_999
_PACK = _COUNT_CLAMP + 1
# Up to this many (key, node) pairs, best_matches on SQLite probes each pair in the
# unique index; beyond it, scanning the keys' rows is cheaper (measured crossover
# between 1000 and 5000 nodes for a four-segment label over 100 000 rows).
_SQLITE_PROBES = 4000


def split_pipeline_label(value: str | None) -> list[str]:
    """Return the keys of a pipeline label value, from general to specific.

    `jenkins-java-maven-1` gives `["jenkins", "java", "maven", "1"]`; empty segments
    (`a--b`, a trailing `-`) are ignored. None or "" gives [].
    """
    if not value:
        return []
    return [segment for segment in value.split("-") if segment]


def increment_key_nodes(
    *,
    keys: Iterable[str],
    node: str,
    by: int = 1,
    now: datetime | None = None,
    ledgered: bool = False,
) -> None:
    """Add `by` to KeyNode(key, node) for every key, creating missing rows.

    One statement: an upsert whose update adds to the stored count (qualified with the
    table name, as PostgreSQL requires). Safe against concurrent writers on both
    backends; duplicate keys in `keys` are counted once.

    The same statement keeps the recency state (`decayed_weight` valued at
    `decayed_at`) exact: the stored weight and the new one are both carried to the
    later of the two instants, halving once per half-life, then added (see
    `accumulate_decayed`, which does the same in Python for the simulator).

    `ledgered` says the caller writes a ledger row in the same transaction
    (`record_placement`); without one, the write is announced to this process's
    match caches once committed (other processes' caches learn of a KeyNode change
    from the ledger only).
    """
    unique_keys = list(dict.fromkeys(keys))
    if not unique_keys:
        return
    now = now or timezone.now()
    at = now.timestamp()
    table = KeyNode._meta.db_table
    rows = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s)"] * len(unique_keys))
    params: list = []
    for key in unique_keys:
        params += [key, node, by, float(by), at, now, now, now]
    stored, new = f"{table}.decayed_at", "excluded.decayed_at"
    sql = (
        f"INSERT INTO {table} (key, node, count, decayed_weight, decayed_at, "
        f"last_placed_at, created, updated) "
        f"VALUES {rows} "
        f"ON CONFLICT (key, node) DO UPDATE SET "
        f"count = {table}.count + excluded.count, "
        f"decayed_weight = {table}.decayed_weight * {_halvings_sql(new, stored)} "
        f"+ excluded.decayed_weight * {_halvings_sql(stored, new)}, "
        f"decayed_at = CASE WHEN {new} > {stored} THEN {new} ELSE {stored} END, "
        f"last_placed_at = excluded.last_placed_at, updated = excluded.updated"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    if not ledgered:
        from history.matchcache import UNLEDGERED

        pair = (tuple(unique_keys), node)
        transaction.on_commit(lambda: UNLEDGERED.append(pair))


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
        placement, created = Placement.objects.get_or_create(
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
            # Warmth is judged from history as it stood before this pod counted.
            if not warmth:
                placement.warmth = classify_warmth(keys=keys, node=node)
                Placement.objects.filter(pk=placement.pk).update(
                    warmth=placement.warmth
                )
            increment_key_nodes(keys=keys, node=node, now=now, ledgered=True)
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
    clamped at 999999. On SQLite, outside a transaction, the answer comes from this
    thread's `history.matchcache.MatchCache`, brought up to date from the ledger
    first. Otherwise one query, one row per node: the database picks the most
    specific key per node, so no per-row work is left to Python.
    """
    if not keys or not nodes:
        return {}
    if connection.vendor == "sqlite" and not connection.in_atomic_block:
        return _match_cache().best_matches(keys, nodes)
    table = KeyNode._meta.db_table
    # Later occurrences win: a segment repeated in a label counts at its most
    # specific position.
    positions = {key: index for index, key in enumerate(keys)}
    case = " ".join("WHEN %s THEN %s" for _ in positions)
    case_params: list = []
    for key, index in positions.items():
        case_params += [key, index]
    key_marks = ", ".join(["%s"] * len(positions))
    packed = (
        f"MAX((CASE k.key {case} END) * {_PACK} + "
        f"CASE WHEN k.count > {_COUNT_CLAMP} THEN {_COUNT_CLAMP} ELSE k.count END)"
    )
    where = f"k.key IN ({key_marks}) AND k.count > 0"
    if connection.vendor == "postgresql":
        sql = (
            f"SELECT k.node, {packed} FROM {table} AS k "
            f"WHERE {where} AND k.node = ANY(%s) GROUP BY k.node"
        )
        params = [*case_params, *positions, list(nodes)]
    elif len(nodes) * len(positions) <= _SQLITE_PROBES:
        # SQLite cannot tell how many values json_each yields and would walk the
        # node index, reading every row of every candidate node (60 ms for 5000
        # nodes over 100 000 rows). For few (key, node) pairs, probe each pair in
        # the unique index instead.
        sql = (
            f"SELECT k.node, {packed} FROM json_each(%s) AS j "
            f"CROSS JOIN {table} AS k ON k.node = j.value "
            f"WHERE {where} GROUP BY k.node"
        )
        params = [*case_params, orjson.dumps(list(nodes)).decode(), *positions]
    else:
        # Many pairs: scan the rows of the keys once and test each node against
        # the candidate set; the unary `+` keeps SQLite off the node index.
        sql = (
            f"SELECT k.node, {packed} FROM {table} AS k WHERE {where} "
            f"AND +k.node IN (SELECT value FROM json_each(%s)) GROUP BY k.node"
        )
        params = [*case_params, *positions, orjson.dumps(list(nodes)).decode()]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return {node: divmod(packed, _PACK) for node, packed in rows}


def derive_best_matches(*, keys: Sequence[str], derive):
    """`derive(keys, matches)` over the best matches of every node for `keys`.

    `matches` is what `best_matches` returns, for all nodes with history instead of
    a given list. On SQLite, outside a transaction, the result is kept and reused
    until that history changes, so `derive` must be a pure function and the same
    object each call (a module-level function). Returns None where no such copy is
    kept (PostgreSQL, inside a transaction): callers then use `best_matches`.
    Prioritize uses it to score a label's nodes once instead of on every call.
    """
    if connection.vendor == "sqlite" and not connection.in_atomic_block:
        return _match_cache().derive(keys, derive)
    return None


def warm_state(*, keys: Sequence[str], label: str):
    """This thread's up-to-date `warm` inputs for a label, or None where none are
    kept (PostgreSQL, inside a transaction): callers then use `key_node_history`,
    `active_pods` and `scoring_policies`.

    Returns the `history.matchcache.MatchCache`, brought up to date (one PRAGMA
    when nothing was committed since the last call), and the label's
    `history.matchcache.WarmLabel`. The cache's `active.get(label, {})` and `busy`
    are what `active_pods(label=label)` returns, its `policies` what
    `scoring_policies` returns for every key, `memo` is free for derived data.
    """
    if connection.vendor == "sqlite" and not connection.in_atomic_block and keys:
        cache = _match_cache()
        return cache, cache.warm(keys)
    return None


_MATCH_CACHES = threading.local()


def _match_cache():
    """This thread's MatchCache (Django connections are per thread too)."""
    cache = getattr(_MATCH_CACHES, "cache", None)
    if cache is None:
        from history.matchcache import MatchCache

        cache = _MATCH_CACHES.cache = MatchCache(clamp=_COUNT_CLAMP)
    return cache


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


def placements_with_key(*, key: str):
    """Placements whose pipeline label contains `key` as a whole segment.

    A QuerySet of Placement, newest first. `java` matches `jenkins-java-maven`
    but not `javascript`.
    """
    return Placement.objects.filter(
        Q(label=key)
        | Q(label__startswith=f"{key}-")
        | Q(label__endswith=f"-{key}")
        | Q(label__contains=f"-{key}-")
    )


def key_totals():
    """Per key: total count over all nodes, number of nodes, latest placement.

    A QuerySet of dicts {key, total, nodes, last_placed_at}, busiest key first.
    """
    return (
        KeyNode.objects.values("key")
        .annotate(
            total=Sum("count"),
            nodes=Count("node"),
            last_placed_at=Max("last_placed_at"),
        )
        .order_by("-total", "key")
    )


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
    # One UPDATE on the hot path; the row is created the first time only.
    if not WatchState.objects.filter(name=name).update(**changes):
        WatchState.objects.get_or_create(name=name)
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


# --- Recency, warmth and placement quality (the `warm` scoring) ---------------------

# 0.5 ** 1000 is still a normal float; PostgreSQL raises on float underflow, so the
# number of halvings is bounded in SQL and in Python alike.
_MAX_HALVINGS = 1000.0
# Beyond this many half-lives a weight stops falling (for callers that rely on it).
MAX_HALVINGS = _MAX_HALVINGS


def half_life_seconds() -> float:
    """KSSCHED_HALF_LIFE_DAYS in seconds; a placement's weight halves this often."""
    days = float(settings.KSSCHED_HALF_LIFE_DAYS)
    if days <= 0:
        raise ImproperlyConfigured("KSSCHED_HALF_LIFE_DAYS must be greater than 0")
    return days * 86400.0


def _halvings_sql(later: str, earlier: str) -> str:
    """SQL for 0.5 ** ((later - earlier) / half-life), 1 when `later` is not later."""
    half_life = repr(half_life_seconds())
    gap = f"({later} - {earlier})"
    return (
        f"POWER(0.5, CASE WHEN {gap} <= 0 THEN 0.0 "
        f"WHEN {gap} / {half_life} > {_MAX_HALVINGS} THEN {_MAX_HALVINGS} "
        f"ELSE {gap} / {half_life} END)"
    )


def decayed_weight(*, weight: float, at: float, now: float, half_life: float) -> float:
    """A recency weight valued at `at` (Unix seconds), carried forward to `now`.

    It halves every `half_life` seconds; a `now` before `at` leaves it unchanged.
    """
    if now <= at:
        return weight
    return weight * 0.5 ** min((now - at) / half_life, _MAX_HALVINGS)


def accumulate_decayed(
    *, weight: float, at: float, add: float, add_at: float, half_life: float
) -> tuple[float, float]:
    """Add `add` placements made at `add_at` to a weight valued at `at`.

    Returns (weight, at) valued at the later instant: exactly what the upsert in
    `increment_key_nodes` stores, so the simulator's state matches the database's.
    """
    later = max(at, add_at)
    total = decayed_weight(
        weight=weight, at=at, now=later, half_life=half_life
    ) + decayed_weight(weight=add, at=add_at, now=later, half_life=half_life)
    return total, later


def classify_warmth(*, keys: Sequence[str], node: str) -> str:
    """How warm `node` is for a pod with label segments `keys`, from KeyNode rows.

    "exact" when the most specific segment has history on the node, "partial" when
    only a more general one has, "cold" otherwise (and for a pod without segments).
    History from before a node replacement does not count.
    """
    if not keys:
        return Placement.Warmth.COLD
    rows = KeyNode.objects.filter(key__in=set(keys), node=node, count__gt=0)
    since = _replaced_since(nodes=[node]).get(node)
    if since is not None:
        rows = rows.filter(decayed_at__gte=since)
    warm = set(rows.values_list("key", flat=True))
    if keys[-1] in warm:
        return Placement.Warmth.EXACT
    if warm:
        return Placement.Warmth.PARTIAL
    return Placement.Warmth.COLD


def _nodes_filter(column: str, nodes: Sequence[str]) -> tuple[str, object]:
    """A `column IN nodes` condition with one parameter, whatever the node count."""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", list(nodes)
    return f"{column} IN (SELECT value FROM json_each(%s))", orjson.dumps(
        list(nodes)
    ).decode()


def _replaced_since(*, nodes: Sequence[str]) -> dict[str, float]:
    """For replaced nodes among `nodes`: Unix seconds since which history counts.

    Only nodes seen with a new UID (replacements > 0) are returned: a node seen for
    the first time keeps the history recorded before ks-scheduler knew its UID.
    """
    if not nodes:
        return {}
    condition, param = _nodes_filter("name", nodes)
    rows = (
        NodeRecord.objects.filter(replacements__gt=0, history_since__isnull=False)
        .extra(where=[condition], params=[param])
        .values_list("name", "history_since")
    )
    return {name: since.timestamp() for name, since in rows}


def key_node_history(
    *,
    keys: Sequence[str],
    nodes: Sequence[str],
    settled: tuple[float, float, float] | None = None,
) -> dict[str, list[tuple[str, int, float, float]]]:
    """The history rows of `keys` on `nodes`, grouped by node.

    Returns {node: [(key, count, decayed_weight, decayed_at), ...]} for rows with
    count > 0, leaving out rows last placed before their node was replaced. Two
    queries whatever the number of nodes: the rows (served by the (key, node)
    index) and the replaced nodes among those that have rows.

    With `settled` = (min_weight, now, half-life) on PostgreSQL, rows that cannot
    decide a score are left in the database: where a more specific key's weight at
    `now` (`min(weight, count)`, a hand-made row weighing its count) is surely at
    or above `min_weight`, the less specific rows of that node are not returned.
    "Surely" leaves a relative margin of 1e-9 for the database's floating point;
    nodes replaced at some point keep all their rows (the replacement filter
    applies first). `_best_segment` picks the same row from what is left. Only for
    `_SETTLED_MIN_NODES` nodes or more: below, the ranking costs more than it saves.
    """
    if not keys or not nodes:
        return {}
    condition, param = _nodes_filter("node", nodes)
    unique = list(dict.fromkeys(keys))
    marks = ", ".join(["%s"] * len(unique))
    sql = (
        f"SELECT node, key, count, decayed_weight, decayed_at "
        f"FROM {KeyNode._meta.db_table} "
        f"WHERE key IN ({marks}) AND count > 0 AND {condition}"
    )
    params = [*unique, param]
    if (
        settled is not None
        and connection.vendor == "postgresql"
        and len(nodes) >= _SETTLED_MIN_NODES
    ):
        sql, params = _settled_history_sql(keys, sql, params, *settled)
    # A plain cursor: thousands of rows per request, no model instances needed.
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    history: dict[str, list[tuple[str, int, float, float]]] = {}
    for node, key, count, weight, at in rows:
        if node in history:
            history[node].append((key, count, weight, at))
        else:
            history[node] = [(key, count, weight, at)]
    replaced = _replaced_since(nodes=list(history))
    for node, since in replaced.items():
        kept = [row for row in history[node] if row[3] >= since]
        if kept:
            history[node] = kept
        else:
            del history[node]
    return history


# Measured at 100, 1000 and 5000 candidate nodes over the benchmark history: the
# window ranking saves 10-15 % from 1000 nodes on and costs 1 ms at 100.
_SETTLED_MIN_NODES = 1000


def _settled_history_sql(keys, sql, params, min_weight, now, half_life):
    """Wrap the rows query of `key_node_history` to drop rows that cannot decide."""
    positions = {key: index for index, key in enumerate(keys)}
    case = " ".join("WHEN %s THEN %s" for _ in positions)
    case_params: list = []
    for key, index in positions.items():
        case_params += [key, index]
    weight = (
        "LEAST(k.count, CASE WHEN k.decayed_at = 0 THEN k.count "
        "ELSE k.decayed_weight * POWER(0.5, LEAST(GREATEST(%s - k.decayed_at, 0.0) "
        f"/ %s, {_MAX_HALVINGS})) END)"
    )
    wrapped = (
        f"SELECT node, key, count, decayed_weight, decayed_at FROM ("
        f"SELECT k.*, (CASE k.key {case} END) AS position, MAX(CASE WHEN "
        f"{weight} >= %s AND r.name IS NULL THEN (CASE k.key {case} END) END) "
        f"OVER (PARTITION BY k.node) AS sure FROM ({sql}) AS k "
        f"LEFT JOIN {NodeRecord._meta.db_table} AS r ON r.name = k.node "
        f"AND r.replacements > 0 AND r.history_since IS NOT NULL"
        f") AS ranked WHERE sure IS NULL OR position >= sure"
    )
    return wrapped, [
        *case_params,
        float(now),
        float(half_life),
        min_weight * (1 + 1e-9),
        *case_params,
        *params,
    ]


def active_pods(*, label: str) -> tuple[dict[str, int], dict[str, int]]:
    """The pods running right now per node, from the ledger rows not yet finished.

    Returns ({node: pods with pipeline label `label`}, {node: all pipeline pods}).
    One query over the active rows only (a partial index); idle nodes are absent.
    """
    rows = (
        Placement.objects.filter(finished_at__isnull=True)
        .values("node")
        .annotate(pods=Count("pk"), same=Count("pk", filter=Q(label=label)))
        .values_list("node", "same", "pods")
    )
    same_label: dict[str, int] = {}
    busy: dict[str, int] = {}
    for node, same, pods in rows:
        busy[node] = pods
        if same:
            same_label[node] = same
    return same_label, busy


def scoring_policies(
    *, keys: Sequence[str]
) -> tuple[dict[str, tuple[bool, float]], dict[str, dict[str, str]]]:
    """The per-key policy rows for `keys`: two small queries.

    Returns ({key: (enabled, weight)}, {key: {node: "pin" | "ban"}}).
    """
    if not keys:
        return {}, {}
    unique = set(keys)
    key_policies = {
        key: (enabled, weight)
        for key, enabled, weight in KeyPolicy.objects.filter(
            key__in=unique
        ).values_list("key", "enabled", "weight")
    }
    node_policies: dict[str, dict[str, str]] = {}
    for key, node, action in NodePolicy.objects.filter(key__in=unique).values_list(
        "key", "node", "action"
    ):
        node_policies.setdefault(key, {})[node] = action
    return key_policies, node_policies


def placement_hit_rates(
    *, since: datetime | None = None, until: datetime | None = None
) -> dict:
    """Placement quality over a window of `bound_at`: overall and per pipeline label.

    Returns {"overall": stats, "by_label": {label: stats}} where stats is
    {"placements", "exact", "partial", "cold", "unclassified", "exact_rate",
    "partial_rate", "hit_rate"}. Rates are fractions of the classified placements
    (None when there are none); hit_rate = exact + partial. One GROUP BY query.
    """
    rows = Placement.objects.all()
    if since is not None:
        rows = rows.filter(bound_at__gte=since)
    if until is not None:
        rows = rows.filter(bound_at__lt=until)
    grouped = rows.values("label", "warmth").annotate(n=Count("pk"))
    tallies: dict[str, dict[str, int]] = {}
    overall: dict[str, int] = {}
    for row in grouped:
        warmth = row["warmth"] or "unclassified"
        by_label = tallies.setdefault(row["label"], {})
        by_label[warmth] = by_label.get(warmth, 0) + row["n"]
        overall[warmth] = overall.get(warmth, 0) + row["n"]
    return {
        "overall": _hit_stats(overall),
        "by_label": {label: _hit_stats(t) for label, t in sorted(tallies.items())},
    }


def _hit_stats(tally: dict[str, int]) -> dict:
    exact = tally.get("exact", 0)
    partial = tally.get("partial", 0)
    cold = tally.get("cold", 0)
    classified = exact + partial + cold
    unclassified = tally.get("unclassified", 0)

    def rate(n: int) -> float | None:
        return round(n / classified, 4) if classified else None

    return {
        "placements": classified + unclassified,
        "exact": exact,
        "partial": partial,
        "cold": cold,
        "unclassified": unclassified,
        "exact_rate": rate(exact),
        "partial_rate": rate(partial),
        "hit_rate": rate(exact + partial),
    }
