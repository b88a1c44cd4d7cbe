"""`manage.py outcomes`: startup and run time by warmth, and the time warm placement
saved, per pipeline label and overall (`history.outcomes`); with `--workspaces`, the
startup of exact placements by how many other pipelines ran on the node since, and
how long ago (`history.workspaces`)."""

from typing import Any

import orjson
from django.core.management.base import BaseCommand, CommandError, CommandParser

from history.outcomes import format_report, outcome_report, parse_instant
from history.workspaces import format_workspaces, workspace_report


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
        parser.add_argument(
            "--workspaces",
            action="store_true",
            help="report the startup of exact placements by depth (the other "
            "pipelines placed on the node since the pipeline last was) and by age "
            "(the time since): how long workspaces last on these nodes",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        since = None
        if options["since"]:
            try:
                since = parse_instant(options["since"])
            except ValueError as exc:
                raise CommandError(f"--since: {exc}") from exc
        label = options["label"] or None
        if options["workspaces"]:
            report = workspace_report(label=label, since=since)
            text = format_workspaces
        else:
            report = outcome_report(label=label, since=since)
            text = format_report
        if options["json"]:
            self.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
        else:
            self.stdout.write(text(report))
