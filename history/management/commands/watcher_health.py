"""`manage.py watcher_health`: the watcher's liveness probe.

Exits 0 when the heartbeat file was touched within --max-age seconds, 1 when it
is older or missing. The watcher touches it on every event, bookmark, reconnect
attempt and backoff tick (and while standing by for the lease), so a watch that is
stuck fails the probe even though the process is alive.

A healthy answer also names the events the watcher skipped because they could not
be written (from WatchState); they do not fail the probe, since a restart would not
bring them back.
"""

import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, connection

from history.watcher.health import first_line, stream_health, with_skipped_events
from history.watcher.heartbeat import default_max_age, heartbeat_age

# Seconds a PostgreSQL connection may take before the skipped events are left out,
# well inside the probe's timeout.
CONNECT_TIMEOUT = 3


class Command(BaseCommand):
    requires_system_checks = []
    help = "Exit 0 if the watcher's heartbeat is fresh, 1 if stale or missing."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--max-age",
            type=float,
            default=None,
            help="Seconds (default: read timeout + backoff cap + 30).",
        )
        parser.add_argument(
            "--path", default=None, help="Heartbeat file (KSSCHED_HEARTBEAT_PATH)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["path"] or settings.KSSCHED_HEARTBEAT_PATH
        max_age = options["max_age"]
        if max_age is None:
            max_age = default_max_age()
        age = heartbeat_age(path)
        if age is None:
            self.stderr.write(f"unhealthy: no heartbeat file at {path}")
            sys.exit(1)
        if age > max_age:
            self.stderr.write(
                f"unhealthy: heartbeat {age:.0f} s old (limit {max_age:.0f} s)"
            )
            sys.exit(1)
        self.stdout.write(f"ok: heartbeat {age:.1f} s old{_skipped_events()}")


def _skipped_events() -> str:
    """Per stream "; pods: N events skipped, last: ...", or "" when none."""
    if connection.vendor == "postgresql":
        connection.settings_dict["OPTIONS"].setdefault(
            "connect_timeout", CONNECT_TIMEOUT
        )
    try:
        streams = with_skipped_events(stream_health())
    except DatabaseError as exc:
        return f"; skipped events unknown ({first_line(exc)})"
    return "".join(
        f"; {stream.name}: {stream.skipped_events} events skipped, "
        f"last: {stream.last_skipped}"
        for stream in streams
    )
