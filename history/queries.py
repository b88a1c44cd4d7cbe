"""Queries the admin, the history API and the admin index share."""

from __future__ import annotations

from django.db.models import Count, Max, Q, Sum

from history.labels import key_kind, key_label, split_pipeline_label
from history.models import KeyNode, Placement


def placements_with_key(*, key: str):
    """Placements that count under `key` (`labels.placement_keys`).

    A QuerySet of Placement. A segment matches as a whole segment: `java` matches
    `jenkins-java-maven` but not `javascript`. A prefix `jenkins-java-*` matches
    `jenkins-java` and the labels under it; a pipeline `jenkins-java$` matches
    that label only. (A label written with empty segments, `jenkins--java`, counts
    under `jenkins-java$` but is not matched here: the match is on the stored text.)
    """
    kind = key_kind(key)
    if kind != "segment":
        label = key_label(key)
        if kind == "pipeline":
            return Placement.objects.filter(label=label)
        return Placement.objects.filter(
            Q(label=label) | Q(label__startswith=f"{label}-")
        )
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
