"""Peak memory and time of the passes over the whole placement ledger.

    python -m tools.bench.migration_memory [--placements 1000000] [--nodes 5000]
        [--pipelines 10000] [--database-url postgres://.../kssched_bench]

Builds a throw-away database (a SQLite file in a temporary directory, or the
PostgreSQL database named by `--database-url`, dropped and created again) with
`--placements` ledger rows of `--pipelines` labels over `--nodes` nodes, bound over
90 days. Then, each in a fresh process so that each peak is its own, it runs
migration 0013's function (every label-path row rebuilt from the ledger and every
placement's warmth judged again), `audit_counts` and
`prune_placements` of the older half of the ledger, and prints each one's peak
resident memory (`ru_maxrss`, which includes Django and the interpreter, about
60 MiB) and its time per 100 000 placements.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent.parent
INSERT_BATCH = 10_000
DAYS = 90


def setup_django(env: dict[str, str]) -> None:
    # Only what the bench sets: not the caller's database or settings module.
    os.environ.pop("DATABASE_URL", None)
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "kssched.settings"
    sys.path.insert(0, str(REPO))
    import django

    django.setup()


def build(placements: int, nodes: int, pipelines: int) -> None:
    """Migrate the empty database and fill the ledger node by node, with the
    segment rows its placements count under (the path rows are the replay's to
    write), so that `audit_counts` finds the history balanced."""
    from collections import Counter
    from datetime import UTC, datetime, timedelta

    from django.core.management import call_command
    from django.db import connection

    from history.labels import split_pipeline_label
    from history.models import KeyNode, Placement

    call_command("migrate", verbosity=0)
    rng = random.Random(1)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    adapt = connection.ops.adapt_datetimefield_value
    table = connection.ops.quote_name(KeyNode._meta.db_table)
    insert = (
        f"INSERT INTO {table} (key, node, count, decayed_weight, decayed_at, "
        "last_placed_at, created, updated) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
    )
    uid = 0
    rows: list[Placement] = []
    for number in range(nodes):
        node = f"node-{number}"
        segments: Counter[str] = Counter()
        share = placements // nodes + (1 if number < placements % nodes else 0)
        for _ in range(share):
            pipeline = rng.randrange(pipelines)
            label = "-".join(
                (
                    f"ci{pipeline % 5}",
                    f"team{pipeline % 200}",
                    f"svc{pipeline % 1000}",
                    f"p{pipeline}",
                )
            )
            bound = start + timedelta(seconds=rng.uniform(0, DAYS * 86400))
            rows.append(
                Placement(
                    pod_uid=f"uid-{uid}",
                    namespace="ci",
                    name=f"pod-{uid}",
                    label=label,
                    node=node,
                    bound_at=bound,
                    finished_at=bound + timedelta(minutes=10),
                )
            )
            uid += 1
            segments.update(set(split_pipeline_label(label)))
        now = adapt(start + timedelta(days=DAYS))
        with connection.cursor() as cursor:
            cursor.executemany(
                insert,
                [
                    (k, node, c, float(c), 0.0, now, now, now)
                    for k, c in segments.items()
                ],
            )
        if len(rows) >= INSERT_BATCH:
            Placement.objects.bulk_create(rows)
            rows.clear()
    Placement.objects.bulk_create(rows)


def run_pass(name: str) -> dict[str, float]:
    """One pass over the ledger in this process; its seconds and peak RSS."""
    from datetime import UTC, datetime, timedelta

    from django.apps import apps
    from django.db import transaction

    from history import audit

    started = time.perf_counter()
    if name == "migration_0013":
        migration = importlib.import_module("history.migrations.0013_label_path")
        with transaction.atomic():
            migration.build(apps, None)
    elif name == "audit_counts":
        checked, drifts = audit.audit_counts()
        assert not drifts, drifts[:3]
    elif name == "prune_placements":
        half = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=DAYS / 2)
        audit.prune_placements(before=half, actor="bench")
    seconds = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_mib": peak_kib / 1024}


def child(argv: list[str]) -> None:
    what, env_file = argv[0], argv[1]
    env = dict(line.split("=", 1) for line in Path(env_file).read_text().splitlines())
    setup_django(env)
    if what == "build":
        build(int(argv[2]), int(argv[3]), int(argv[4]))
        return
    result = run_pass(what)
    print(f"{result['seconds']:.3f} {result['peak_mib']:.1f}")


def recreate_postgres(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def spawn(args: list[str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.migration_memory", "--child", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        sys.exit(f"{args[0]} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--placements", type=int, default=200_000)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pipelines", type=int, default=10_000)
    parser.add_argument("--database-url", default="")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "SECRET_KEY": "bench",
            "DATA_PATH": str(Path(tmp) / "bench.sqlite3"),
            "KSSCHED_READ_DOT_ENV": "0",
            "KSSCHED_LOG_LEVEL": "ERROR",
        }
        if options.database_url:
            recreate_postgres(options.database_url)
            env["DATABASE_URL"] = options.database_url
        env_file = Path(tmp) / "env"
        env_file.write_text("\n".join(f"{k}={v}" for k, v in env.items()))
        started = time.perf_counter()
        spawn(
            [
                "build",
                str(env_file),
                str(options.placements),
                str(options.nodes),
                str(options.pipelines),
            ]
        )
        database = "PostgreSQL" if options.database_url else "SQLite"
        print(
            f"{database}: {options.placements} placements, {options.pipelines} "
            f"pipelines, {options.nodes} nodes (built in "
            f"{time.perf_counter() - started:.0f} s)"
        )
        per = options.placements / 100_000
        for name in ("migration_0013", "audit_counts", "prune_placements"):
            seconds, peak = (float(x) for x in spawn([name, str(env_file)]).split())
            print(
                f"  {name:17s} peak RSS {peak:6.1f} MiB, {seconds:7.1f} s "
                f"({seconds / per:.1f} s per 100 000 placements)"
            )
        if options.database_url:
            recreate_postgres(options.database_url)


if __name__ == "__main__":
    main()
