"""How long the admin's bulk actions take over one key's rows (issue 31, item 3).

    python -m tools.bench.bulk_actions [--rows 10000] [--rounds 3]
    DATABASE_URL=postgres://postgres@127.0.0.1:55432/kssched_h2bench \\
        python -m tools.bench.bulk_actions

Against a fresh SQLite file under the test settings, or the (existing, emptied)
database of DATABASE_URL: loads `--rows` KeyNode rows of the prefix key `jenkins-*`,
one per node, each with its adjustment (as an import makes them), then, logged in
as a superuser through Django's test client, selects every row of
`?key=jenkins-*` ("select all") and runs "Halve selected counts", "Reset selected
counts to zero" and "Delete selected" (confirmed), as a platform engineer would.
Each action is timed from the POST to its answer; each round loads the rows
again. After every action the audit must balance and every changed row must have
its adjustment and its admin log entry, or the run stops.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
# A checkout without collected static files: whitenoise says so once; not news here.
warnings.filterwarnings("ignore", "No directory at")

import django  # noqa: E402

django.setup()

from django.contrib.admin.models import LogEntry  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from history.audit import audit_counts  # noqa: E402
from history.corrections import add_key_node_counts  # noqa: E402
from history.models import CountAdjustment, KeyNode  # noqa: E402

KEY = "jenkins-*"
URL = "/admin/history/keynode/"


def load(rows: int) -> None:
    """`rows` rows of KEY, counts 1..200, with their adjustments; nothing else."""
    KeyNode.objects.all().delete()
    CountAdjustment.objects.all().delete()
    LogEntry.objects.all().delete()
    counts = {(KEY, f"node-{i:06d}"): 1 + (i * 7919) % 200 for i in range(rows)}
    add_key_node_counts(counts=counts, actor="bench", reason="import")
    with connection.cursor() as cursor:
        cursor.execute(
            "VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE"
        )


def act(client: Client, action: str, **extra: str) -> float:
    """Run `action` on every row of KEY ("select all"); seconds to the answer."""
    data = {
        "action": action,
        "select_across": "1",
        "index": "0",
        "_selected_action": [str(KeyNode.objects.filter(key=KEY).first().pk)],
        **extra,
    }
    started = time.perf_counter()
    response = client.post(f"{URL}?key={KEY}", data)
    elapsed = time.perf_counter() - started
    if response.status_code != 302:
        raise SystemExit(f"{action}: answered {response.status_code}")
    return elapsed


def check(action: str, rows: int, expected_counts: dict[int, int]) -> None:
    """The audit balances, and each changed row has its adjustment and log entry."""
    _, drifts = audit_counts()
    if drifts:
        raise SystemExit(f"{action}: {len(drifts)} counts drift, e.g. {drifts[0]}")
    counts = sorted(KeyNode.objects.values_list("count", flat=True))
    if action == "delete_selected":
        if counts:
            raise SystemExit(f"{action}: {len(counts)} rows left")
        adjustments = CountAdjustment.objects.filter(reason="deleted").count()
        if adjustments != sum(1 for c in expected_counts.values() if c):
            raise SystemExit(f"{action}: {adjustments} adjustments")
        return
    if counts != sorted(expected_counts.values()):
        raise SystemExit(f"{action}: counts are not what was asked")
    reason = {"halve_counts": "halved", "reset_counts": "reset"}[action]
    logged = LogEntry.objects.filter(change_message__contains="bulk action").count()
    adjusted = CountAdjustment.objects.filter(reason=reason).count()
    if adjusted != logged or adjusted > rows:
        raise SystemExit(f"{action}: {adjusted} adjustments, {logged} log entries")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    call_command("migrate", verbosity=0, interactive=False)
    User.objects.filter(username="bench").delete()
    user = User.objects.create_superuser("bench", "bench@example.com", None)
    times: dict[str, list[float]] = {}
    with override_settings(ALLOWED_HOSTS=["testserver"]):
        client = Client()
        client.force_login(user)
        for _ in range(args.rounds):
            load(args.rows)
            counts = dict(KeyNode.objects.values_list("pk", "count"))
            steps = [
                ("halve_counts", {}, {pk: c // 2 for pk, c in counts.items()}),
                ("reset_counts", {}, dict.fromkeys(counts, 0)),
                ("delete_selected", {"post": "yes"}, dict.fromkeys(counts, 0)),
            ]
            for action, extra, expected in steps:
                LogEntry.objects.all().delete()
                times.setdefault(action, []).append(act(client, action, **extra))
                check(action, args.rows, expected)
    print(
        f"{connection.vendor}, {args.rows} rows of {KEY}, select all through the "
        f"admin, {args.rounds} rounds (seconds):"
    )
    for action, seconds in times.items():
        print(
            f"  {action:16} median {statistics.median(seconds):6.2f}  "
            f"max {max(seconds):6.2f}"
        )
    User.objects.filter(username="bench").delete()


if __name__ == "__main__":
    main()
