"""Template tags for the admin: the history overview on the admin index."""

from datetime import datetime

from django import template
from django.conf import settings
from django.db import connection
from django.db.models import Count, Sum
from django.utils import timezone

from history import queries
from history.models import KeyNode, Placement, WatchState

register = template.Library()

BUSIEST = 5
# A watcher that has not written its heartbeat for this long is shown as stale.
STALE_AFTER_SECONDS = 300


def age_seconds(moment: datetime | None, now: datetime) -> int | None:
    if moment is None:
        return None
    return max(0, int((now - moment).total_seconds()))


def database_description() -> str:
    """Which backend serves history, without credentials."""
    settings_dict = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"SQLite file {settings_dict['NAME']}"
    host = settings_dict.get("HOST") or "localhost"
    port = settings_dict.get("PORT") or ""
    where = f"{host}:{port}" if port else host
    return f"{connection.display_name} {settings_dict.get('NAME')} on {where}"


def watcher_rows(now: datetime) -> list[dict]:
    rows = []
    for state in WatchState.objects.order_by("name"):
        heartbeat_age = age_seconds(state.heartbeat_at, now)
        rows.append(
            {
                "name": state.name,
                "last_event_age": age_seconds(state.last_event_at, now),
                "heartbeat_age": heartbeat_age,
                "is_stale": heartbeat_age is None
                or heartbeat_age > STALE_AFTER_SECONDS,
                "relists": state.relists,
                "events": state.events,
                "resource_version": state.resource_version,
                "holder": state.holder,
            }
        )
    return rows


@register.inclusion_tag("admin/history/overview.html", takes_context=True)
def history_overview(context):
    """Totals, busiest keys and nodes, watcher status and database backend."""
    request = context["request"]
    user = request.user
    if not user.has_perms(("history.view_keynode", "history.view_placement")):
        return {"visible": False}
    now = timezone.now()
    active = Placement.objects.filter(finished_at__isnull=True)
    busiest_nodes = list(
        KeyNode.objects.values("node")
        .annotate(total=Sum("count"), keys=Count("key"))
        .order_by("-total", "node")[:BUSIEST]
    )
    active_by_node = dict(
        active.filter(node__in=[row["node"] for row in busiest_nodes])
        .values_list("node")
        .annotate(n=Count("pk"))
    )
    for row in busiest_nodes:
        row["active"] = active_by_node.get(row["node"], 0)
    totals = {
        "keys": KeyNode.objects.values("key").distinct().count(),
        "nodes": KeyNode.objects.values("node").distinct().count(),
        "placements": Placement.objects.count(),
        "active": active.count(),
    }
    return {
        "visible": True,
        "totals": totals,
        "has_history": bool(totals["keys"] or totals["placements"]),
        "busiest_keys": list(queries.key_totals()[:BUSIEST]),
        "busiest_nodes": busiest_nodes,
        "watchers": watcher_rows(now),
        "stale_after": STALE_AFTER_SECONDS,
        "database": database_description(),
        "pipeline_label": settings.KSSCHED_PIPELINE_LABEL,
        "scheduler_name": settings.KSSCHED_SCHEDULER_NAME,
    }


@register.inclusion_tag("admin/history/empty_state.html")
def history_empty_state():
    """What to check when no history has been recorded yet."""
    return {
        "pipeline_label": settings.KSSCHED_PIPELINE_LABEL,
        "scheduler_name": settings.KSSCHED_SCHEDULER_NAME,
        "has_watcher": WatchState.objects.exists(),
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


# ks-scheduler's own apps, listed before Django's and DRF's on the admin index.
OWN_APPS = ("history", "extender")


@register.filter
def own_apps_first(app_list: list[dict]) -> list[dict]:
    """The admin's app list with ks-scheduler's apps first, the rest in order."""
    return sorted(
        app_list,
        key=lambda app: (
            OWN_APPS.index(app["app_label"]) if app["app_label"] in OWN_APPS else 99
        ),
    )
