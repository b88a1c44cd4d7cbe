"""Queries the admin, the history API and the admin index share."""

from __future__ import annotations

from django.db.models import Count, Max, Q, Sum

from history.models import KeyNode, Placement


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
