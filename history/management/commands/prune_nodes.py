"""`manage.py prune_nodes`: remove the history of nodes that are gone.

Autoscaled clusters replace node names all the time; rows of names that never come
back cost memory in every extender worker and time in every read. A node is gone
when it has been out of the pipeline pool for KSSCHED_NODE_RETENTION_DAYS (or
`--older-than`): no placement on it, no edit of its rows, and the watcher has not
first seen or replaced it. Its rows are deleted with a `node_gone` adjustment each,
so `audit_counts` still balances. The watcher runs this once a day.
"""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from history import audit
from history.management.commands.prune_placements import parse_age


class Command(BaseCommand):
    help = "Remove the KeyNode rows of nodes gone longer than the retention period."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            help="Age such as 90d (default: KSSCHED_NODE_RETENTION_DAYS days).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Only list the nodes that would go."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        age = (
            parse_age(options["older_than"])
            if options["older_than"]
            else timedelta(days=settings.KSSCHED_NODE_RETENTION_DAYS)
        )
        cutoff = timezone.now() - age
        if options["dry_run"]:
            nodes = audit.gone_nodes(before=cutoff)
            self.stdout.write(f"Would remove the rows of {len(nodes)} gone nodes:")
            for node in nodes:
                self.stdout.write(f"  {node}")
            return
        removed = audit.prune_gone_nodes(before=cutoff, actor="prune_nodes")
        self.stdout.write(f"Removed {removed} rows of nodes gone since {cutoff}.")
