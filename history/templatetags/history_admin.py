"""Template tags for the admin: the history overview on the admin index."""

from datetime import datetime, timedelta
from typing import Any

from django import template
from django.conf import settings
from django.db import connection
from django.db.models import Count, Sum
from django.utils import timezone

from history import outcomes, queries
from history.depth_feed import depth_text
from history.models import KeyNode, NodeRecord, Placement
from history.permissions import can_view_history
from history.watcher.health import has_reported, seconds_since, stream_health
from history.watcher.heartbeat import default_max_age

register = template.Library()

BUSIEST = 5


def age_seconds(moment: datetime | None, now: datetime) -> int | None:
    seconds = seconds_since(moment, now)
    return None if seconds is None else max(0, int(seconds))


def database_description() -> str:
    """Which backend serves history, without credentials."""
    settings_dict = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"SQLite file {settings_dict['NAME']}"
    host = settings_dict.get("HOST") or "localhost"
    port = settings_dict.get("PORT") or ""
    where = f"{host}:{port}" if port else host
    return f"{connection.display_name} {settings_dict.get('NAME')} on {where}"


def watcher_streams() -> list[str]:
    """The streams a running watcher reports: pods, and nodes unless turned off."""
    return ["pods", "nodes"] if settings.KSSCHED_WATCH_NODES else ["pods"]


def watcher_status(now: datetime) -> dict[str, Any]:
    """Every stream's progress, and whether the watcher as a whole is stale.

    `events` counts watch events only: objects handled by a list (the first one, or
    one after 410 Gone) show up in `recorded`, what the stream keeps (placements in
    the ledger for pods, known node identities for nodes). The watcher is stale when
    its newest heartbeat is older than the limit of `watcher_health`, the probe that
    restarts it: both streams beat the same heartbeat file.
    """
    states = {stream.name: stream for stream in stream_health()}
    recorded = {"pods": Placement.objects.count(), "nodes": NodeRecord.objects.count()}
    names = watcher_streams() + sorted(set(states) - set(watcher_streams()))
    rows = []
    for name in names:
        state = states.get(name)
        rows.append(
            {
                "name": name,
                "reported": state is not None,
                "last_event_age": age_seconds(
                    state.last_event_at if state else None, now
                ),
                "heartbeat_age": age_seconds(
                    state.heartbeat_at if state else None, now
                ),
                "relists": state.relists if state else 0,
                "events": state.events if state else 0,
                "recorded": recorded.get(name),
                "resource_version": state.resource_version if state else "",
                "holder": state.holder if state else "",
            }
        )
    beats = [state.heartbeat_at for state in states.values() if state.heartbeat_at]
    heartbeat_age = age_seconds(max(beats), now) if beats else None
    limit = int(default_max_age())
    return {
        "streams": rows if states else [],
        "heartbeat_age": heartbeat_age,
        "limit": limit,
        "is_stale": heartbeat_age is not None and heartbeat_age > limit,
    }


@register.inclusion_tag("admin/history/overview.html", takes_context=True)
def history_overview(context: template.Context) -> dict[str, Any]:
    """Totals, busiest keys and nodes, watcher status and database backend."""
    request = context["request"]
    if not can_view_history(request.user):
        return {"visible": False}
    now = timezone.now()
    active = Placement.objects.filter(finished_at__isnull=True)
    busiest = list(
        KeyNode.objects.values("node")
        .annotate(total=Sum("count"), keys=Count("key"))
        .order_by("-total", "node")[:BUSIEST]
    )
    active_by_node = dict(
        active.filter(node__in=[row["node"] for row in busiest])
        .values_list("node")
        .annotate(n=Count("pk"))
    )
    busiest_nodes = [
        {**row, "active": active_by_node.get(row["node"], 0)} for row in busiest
    ]
    totals = {
        "keys": KeyNode.objects.values("key").distinct().count(),
        "nodes": KeyNode.objects.values("node").distinct().count(),
        "placements": Placement.objects.count(),
        "active": active.count(),
    }
    saved, saved_pipelines = outcomes.total_saved(outcomes.outcome_report(until=now))
    return {
        "visible": True,
        "totals": totals,
        "saved": {
            "seconds": saved,
            "text": outcomes.duration_text(saved),
            "pipelines": saved_pipelines,
            "days": outcomes.WINDOW.days,
            "min_runs": outcomes.MIN_RUNS,
        },
        "has_history": bool(totals["keys"] or totals["placements"]),
        "busiest_keys": queries.busiest_keys(BUSIEST),
        "busiest_nodes": busiest_nodes,
        "watcher": watcher_status(now),
        "database": database_description(),
        "workspace_depth": depth_text(),
        "pipeline_label": settings.KSSCHED_PIPELINE_LABEL,
        "scheduler_name": settings.KSSCHED_SCHEDULER_NAME,
    }


@register.inclusion_tag("admin/history/simulated_times.html")
def simulated_times_note(element_id: str) -> dict[str, Any]:
    """Under `make demo` (tools/demo_settings.py), the note that its startup and run
    times, and so the time saved, are drawn by warmth class: made up, not measured."""
    return {
        "shown": getattr(settings, "KSSCHED_SIMULATED_TIMES", False),
        "element_id": element_id,
    }


@register.inclusion_tag("admin/history/empty_state.html")
def history_empty_state() -> dict[str, Any]:
    """What to check when no history has been recorded yet."""
    return {
        "pipeline_label": settings.KSSCHED_PIPELINE_LABEL,
        "scheduler_name": settings.KSSCHED_SCHEDULER_NAME,
        "has_watcher": has_reported(),
    }


@register.filter
def age(seconds: int | None) -> str:
    """12 → "12 s ago", 600 → "10 min ago"; None → "never"."""
    if seconds is None:
        return "never"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


@register.filter
def duration(span: timedelta | None) -> str:
    """timedelta(minutes=15) → "15 min", timedelta(hours=2) → "2 h"; None → ""."""
    if span is None:
        return ""
    seconds = int(span.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    if seconds >= 60:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds} s"


# ks-scheduler's own apps, listed before Django's and DRF's on the admin index.
OWN_APPS = ("history", "extender")


@register.filter
def own_apps_first(app_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The admin's app list with ks-scheduler's apps first, the rest in order."""
    return sorted(
        app_list,
        key=lambda app: (
            OWN_APPS.index(app["app_label"]) if app["app_label"] in OWN_APPS else 99
        ),
    )
