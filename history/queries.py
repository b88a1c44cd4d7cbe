"""Queries the admin, the history API and the admin index share."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypedDict

from django.db.models import Count, Max, Q, QuerySet, Sum

from history.labels import (
    PIPELINE_MARK,
    PREFIX_MARK,
    key_kind,
    key_label,
    split_pipeline_label,
)
from history.models import KeyNode, Placement


def placements_with_key(*, key: str) -> QuerySet[Placement]:
    """Placements that count under `key` (`labels.placement_keys`).

    A QuerySet of Placement. A segment matches as a whole segment: `java` matches
    `jenkins-java-maven` but not `javascript`. A prefix `jenkins-java-*` matches
    `jenkins-java` and the labels under it; a pipeline `jenkins-java$` matches
    that label only. Every match is case-sensitive on both databases, as the keys
    are (`history.lookups`): `team-build-*` does not match `Team-Build-app`. Path
    keys keep a label's empty segments (`jenkins--*`, `jenkins--java$`), so the
    match on the stored text is the count's.
    """
    kind = key_kind(key)
    if kind != "segment":
        label = key_label(key)
        if kind == "pipeline":
            return Placement.objects.filter(label=label)
        return Placement.objects.filter(
            Q(label=label) | Q(label__cs_startswith=f"{label}-")
        )
    return Placement.objects.filter(
        Q(label=key)
        | Q(label__cs_startswith=f"{key}-")
        | Q(label__cs_endswith=f"-{key}")
        | Q(label__cs_contains=f"-{key}-")
    )


def placements_of_pipeline(*, value: str) -> QuerySet[Placement]:
    """Placements of a pipeline given as a key (`maven`) or a label value.

    One segment is a key and matches as a whole segment (`placements_with_key`);
    a longer value matches its own label and its children (`jenkins-java` matches
    `jenkins-java-maven-app`, not `Jenkins-Java-app`). A QuerySet of Placement.
    """
    keys = split_pipeline_label(value)
    if len(keys) == 1:
        return placements_with_key(key=keys[0])
    return Placement.objects.filter(
        Q(label=value) | Q(label__cs_startswith=f"{value}-")
    )


def keys_of_kind(kind: str) -> Q:
    """The rows (of KeyNode, CountAdjustment, ...) whose `key` is of `kind`, one of
    `labels.KEY_KINDS`, as a condition on `key` the database evaluates: the SQL
    form of `labels.key_kind`. An unknown kind matches nothing."""
    pipeline = Q(key__endswith=PIPELINE_MARK)
    prefix = Q(key__endswith=PREFIX_MARK)
    if kind == "pipeline":
        return pipeline
    if kind == "prefix":
        return prefix
    if kind == "segment":
        return ~pipeline & ~prefix
    return Q(pk__in=[])


class KeyTotal(TypedDict):
    """A row of `key_totals`."""

    key: str
    total: int
    nodes: int
    last_placed_at: datetime | None


def key_totals() -> QuerySet[KeyNode, KeyTotal]:
    """Per key: total count over all nodes, number of nodes, latest placement.

    A QuerySet of dicts {key, total, nodes, last_placed_at}, busiest key first; every
    kind of key (filter with `keys_of_kind`, name a row's kind with
    `labels.key_kind`).
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


def busiest_keys(limit: int) -> list[dict[str, Any]]:
    """The `limit` busiest rows of `key_totals`, each with its `kind`
    (`labels.key_kind`) and the `label` the pipeline page looks up for it
    (`labels.key_label`: `jenkins-java` for `jenkins-java-*`)."""
    return [
        {**row, "kind": key_kind(row["key"]), "label": key_label(row["key"])}
        for row in key_totals()[:limit]
    ]


def bound_times(*, label: str, since: float, limit: int) -> list[float]:
    """When the ledger's pods of `label` bound at or after `since` were bound
    (epoch seconds, at most `limit`, oldest first): the webhook's steering memory
    retires the steered pods they were."""
    start = datetime.fromtimestamp(since, tz=UTC)
    rows = (
        Placement.objects.filter(label=label, bound_at__gte=start)
        .order_by("bound_at")
        .values_list("bound_at", flat=True)[:limit]
    )
    return [bound.timestamp() for bound in rows]
