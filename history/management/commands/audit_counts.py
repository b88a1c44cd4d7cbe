"""`manage.py audit_counts`: check every count against the placement ledger.

For each (key, node): count == ledger rows whose label contains key + recorded
adjustments (admin edits, resets, pruning). Exit status 0 when everything balances,
1 when there is drift (each drift is listed).
"""

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from history import audit


class Command(BaseCommand):
    help = "Report KeyNode counts that differ from ledger rows plus adjustments."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        checked, drifts = audit.audit_counts()
        if options["json"]:
            report = {
                "checked": checked,
                "drift": [
                    {
                        "key": d.key,
                        "node": d.node,
                        "count": d.count,
                        "placements": d.placements,
                        "adjustments": d.adjustments,
                        "difference": d.difference,
                    }
                    for d in drifts
                ],
            }
            self.stdout.write(json.dumps(report, indent=2))
        else:
            for d in drifts:
                self.stdout.write(
                    f"DRIFT {d.key} on {d.node}: count {d.count}, expected "
                    f"{d.expected} ({d.placements} placements "
                    f"{d.adjustments:+d} adjustments), off by {d.difference:+d}"
                )
            verdict = f"{len(drifts)} drifting" if drifts else "no drift"
            self.stdout.write(f"Checked {checked} key/node pairs: {verdict}.")
        if drifts:
            sys.exit(1)
