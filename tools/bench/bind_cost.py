"""What one new binding costs the watcher in CPU, on a loaded history.

    export DATA_PATH=bench.db
    python -c "from tools.bench import cluster; cluster.prepare(300000, 10000)"
    python -m tools.bench.bind_cost [--bindings 300]
    python -m tools.bench.bind_cost --pragma "PRAGMA cache_size=-65536"

The watcher writes each new binding in a transaction of its own, at once, so that
prioritize counts the bound pod (`history.watcher.pods.PodHandler.urgent`). This
enters `--bindings` placements of random pipelines (of `--pipelines`, named as
`tools.bench.cluster` names them) on the database's own nodes, one transaction
each, through `ledger.enter_placement` as the watcher does, and reports the process
CPU and the wall time per binding. It writes to the database: load one for it (the
first line, the history `make bench-e2e` loads). `--pragma` runs a statement on the
connection first, to compare SQLite settings.
"""

from __future__ import annotations

import argparse
import os
import random
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bindings", type=int, default=300)
    parser.add_argument("--pragma", default="")
    parser.add_argument("--pipelines", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kssched.settings")
    import django

    django.setup()
    from django.db import connection, transaction

    from history import ledger
    from history.models import Placement
    from tools.bench import cluster

    if options.pragma:
        with connection.cursor() as cursor:
            cursor.execute(options.pragma)
    nodes = list(Placement.objects.values_list("node", flat=True).distinct()[:1000])
    if not nodes:
        raise SystemExit("The database has no placements: load a history first.")
    rng = random.Random(options.seed)
    run = time.time_ns()
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(options.bindings):
        with transaction.atomic():
            ledger.enter_placement(
                pod_uid=f"bind-cost-{run}-{i}",
                namespace="bench",
                name=f"bind-cost-{i}",
                label=cluster.pipeline(rng.randrange(options.pipelines)),
                node=rng.choice(nodes),
            )
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(
        f"{options.pragma or 'default settings'}: "
        f"{cpu / options.bindings * 1000:.3f} ms CPU and "
        f"{wall / options.bindings * 1000:.3f} ms wall per binding "
        f"({options.bindings} bindings, {connection.vendor})"
    )


if __name__ == "__main__":
    main()
