"""Probe endpoints: `/healthz` (the process answers) and `/readyz` (it can serve).

Both are unauthenticated, plain HTTP and exempt from the HTTPS redirect, so the
kubelet can call them on the pod IP. Neither writes to the database. `/readyz` also
reports events the watcher had to skip: the counts stay servable, one pod is missing.
"""

import logging
import os

from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_safe

from history.watcher.health import first_line, stream_health, with_skipped_events

logger = logging.getLogger(__name__)

# Set once this process has seen every migration applied. Migrations are never
# unapplied under a running server, so later probes only ping the database.
_schema_is_current = False


@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    """200 "ok" while the process serves requests; never touches the database."""
    return HttpResponse("ok", content_type="text/plain")


@require_safe
def readyz(request: HttpRequest) -> HttpResponse:
    """200 when the database answers and every migration is applied, else 503.

    The 503 body is `{"status": "unready", "reason": "..."}`; the reason is also
    logged at WARNING. A 200 body lists, under `skipped_events`, each watch stream
    that skipped events it could not write (count, last one, when).
    """
    reason = _unready_reason()
    if reason:
        logger.warning("Not ready: %s", reason)
        return JsonResponse({"status": "unready", "reason": reason}, status=503)
    answer: dict[str, object] = {"status": "ready"}
    try:
        skipped = _skipped_events()
    except DatabaseError as exc:
        logger.warning("Readiness: cannot read the watcher's skipped events: %s", exc)
        skipped = {}
    if skipped:
        answer["skipped_events"] = skipped
    return JsonResponse(answer)


def _skipped_events() -> dict[str, dict[str, object]]:
    """Per stream, how many events the watcher skipped and the last one."""
    return {
        stream.name: {
            "count": stream.skipped_events,
            "last": stream.last_skipped,
            "at": stream.last_skipped_at.isoformat()
            if stream.last_skipped_at
            else None,
        }
        for stream in with_skipped_events(stream_health())
    }


def _unready_reason() -> str:
    """Why the process cannot serve yet, or "" when it can."""
    global _schema_is_current
    if connection.vendor == "sqlite":
        # An open SQLite connection keeps reading a deleted file, and a new one would
        # silently create an empty database: check that the file is still there.
        path = str(connection.settings_dict["NAME"])
        is_file = path != ":memory:" and not path.startswith("file:")
        if is_file and not os.path.exists(path):
            return f"database file {path} does not exist"
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        if not _schema_is_current:
            executor = MigrationExecutor(connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
            if plan:
                names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
                return (
                    f"{len(plan)} unapplied migration(s) ({names}); "
                    "run `python manage.py migrate`"
                )
            _schema_is_current = True
    except DatabaseError as exc:
        # The first line says what failed (refused, missing file, auth).
        return f"database unreachable: {first_line(exc)}"
    return ""
