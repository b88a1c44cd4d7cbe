"""What the watcher keeps in the database besides placements: where each stream
resumes, its health, and which UID each node name has."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from history.models import NodeRecord, WatchState

# The WatchState rows, one per stream.
PODS = "pods"
NODES = "nodes"


def save_watch_state(
    *,
    name: str,
    resource_version: str | None = None,
    events: int = 0,
    relisted: bool = False,
    holder: str | None = None,
    skipped: str = "",
    now: datetime | None = None,
) -> None:
    """Record progress of watch stream `name` ('pods' or 'nodes').

    Call inside the transaction that holds the effects of the events, so the resume
    resourceVersion never runs ahead of what is committed. `events` adds to the
    event total (and sets last_event_at), `relisted` adds one relist, `skipped`
    (what was dropped) adds one skipped event; heartbeat_at is always set.
    """
    now = now or timezone.now()
    changes: dict[str, Any] = {"heartbeat_at": now, "updated": now}
    if resource_version:
        changes["resource_version"] = resource_version
    if events:
        changes["events"] = F("events") + events
        changes["last_event_at"] = now
    if relisted:
        changes["relists"] = F("relists") + 1
    if holder is not None:
        changes["holder"] = holder
    if skipped:
        changes["skipped_events"] = F("skipped_events") + 1
        changes["last_skipped"] = skipped[:500]
        changes["last_skipped_at"] = now
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
