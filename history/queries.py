"""Queries the admin, the history API and the admin index share."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db.models import Count, Max, Q, Sum

from history.labels import split_pipeline_label
from history.models import KeyNode, NodeRecord, Placement


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


def placements_of_pipeline(*, value: str):
    """Placements of a pipeline given as a key (`maven`) or a label value.

    One segment is a key and matches as a whole segment (`placements_with_key`);
    a longer value matches its own label and its children (`jenkins-java` matches
    `jenkins-java-maven-app`). A QuerySet of Placement.
    """
    keys = split_pipeline_label(value)
    if len(keys) == 1:
        return placements_with_key(key=keys[0])
    return Placement.objects.filter(Q(label=value) | Q(label__startswith=f"{value}-"))


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


def pool_nodes(*, since: float) -> list[str]:
    """The nodes pipeline pods can run on, as far as the history knows, sorted.

    Those with a KeyNode row placed at or after `since` (Unix seconds; rows are
    valued at their last placement, `decayed_at`) and those the watcher first saw,
    or saw replaced, since then: idle nodes count too, and nodes gone for longer
    drop out.
    """
    seen_since = datetime.fromtimestamp(since, tz=UTC)
    placed = (
        KeyNode.objects.filter(count__gt=0, decayed_at__gte=since)
        .order_by()
        .values_list("node", flat=True)
        .distinct()
    )
    seen = NodeRecord.objects.filter(
        Q(first_seen_at__gte=seen_since) | Q(updated__gte=seen_since)
    ).values_list("name", flat=True)
    return sorted(set(placed) | set(seen))
