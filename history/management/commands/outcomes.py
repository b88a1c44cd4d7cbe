"""`manage.py outcomes`: startup and run time by warmth, and the time warm placement
saved, per pipeline label and overall (`history.outcomes`)."""

from typing import Any

import orjson
from django.core.management.base import BaseCommand, CommandError, CommandParser

from history.outcomes import format_report, outcome_report, parse_instant


class Command(BaseCommand):
    help = (
        "Report, per pipeline label and overall, finished and failed runs and the "
        "median and p90 startup and run time by warmth, and the time saved."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--label",
            help="a pipeline key or label value (a label also covers its children)",
        )
        parser.add_argument(
            "--since",
            help="ISO 8601 date or date-time (default: 30 days ago)",
        )
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        since = None
        if options["since"]:
            try:
                since = parse_instant(options["since"])
            except ValueError as exc:
                raise CommandError(f"--since: {exc}") from exc
        report = outcome_report(label=options["label"] or None, since=since)
        if options["json"]:
            self.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
        else:
            self.stdout.write(format_report(report))
