"""`manage.py prune_placements --older-than 30d`: shrink the placement ledger.

Deletes ledger rows of pods that ended before the cutoff and records a `pruned`
adjustment per (key, node), so counts and `audit_counts` are unchanged. A pruned pod
that is still in the cluster would be counted again by a later relist, so keep the
cutoff well beyond how long finished pods stay in the cluster.
"""

import re
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from history import audit

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> timedelta:
    """`30d`, `12h`, `2w`, `90m`, `45s` (a bare number means days)."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhdw]?)\s*", text or "")
    if not match or int(match.group(1)) <= 0:
        raise CommandError(
            f"invalid age {text!r}: use a positive number with s, m, h, d or w"
        )
    return timedelta(seconds=int(match.group(1)) * UNITS[match.group(2) or "d"])


class Command(BaseCommand):
    help = "Delete old placement ledger rows without changing any count."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            required=True,
            help="Age such as 30d, 12h or 2w: rows that ended longer ago go.",
        )
        parser.add_argument(
            "--include-unfinished",
            action="store_true",
            help="Also delete rows bound before the cutoff that never ended.",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Only say how many rows would go."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        cutoff = timezone.now() - parse_age(options["older_than"])
        if options["dry_run"]:
            number = audit.prunable_placements(
                before=cutoff, include_unfinished=options["include_unfinished"]
            ).count()
            self.stdout.write(f"Would prune {number} placements before {cutoff}.")
            return
        deleted = audit.prune_placements(
            before=cutoff,
            include_unfinished=options["include_unfinished"],
            actor="prune_placements",
        )
        self.stdout.write(
            f"Pruned {deleted} placements before {cutoff:%Y-%m-%d %H:%M}."
        )
