"""`manage.py watcher_health`: the watcher's liveness probe.

Exits 0 when the heartbeat file was touched within --max-age seconds, 1 when it
is older or missing. The watcher touches it on every event, bookmark, reconnect
attempt and backoff tick (and while standing by for the lease), so a watch that is
stuck fails the probe even though the process is alive.
"""

import sys

from django.conf import settings
from django.core.management.base import BaseCommand

from history.watcher.heartbeat import default_max_age, heartbeat_age


class Command(BaseCommand):
    requires_system_checks = []
    help = "Exit 0 if the watcher's heartbeat is fresh, 1 if stale or missing."

    def add_arguments(self, parser):
        parser.add_argument(
            "--max-age",
            type=float,
            default=None,
            help="Seconds (default: read timeout + backoff cap + 30).",
        )
        parser.add_argument(
            "--path", default=None, help="Heartbeat file (KSSCHED_HEARTBEAT_PATH)."
        )

    def handle(self, *args, **options):
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
        self.stdout.write(f"ok: heartbeat {age:.1f} s old")
