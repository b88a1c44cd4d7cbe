"""`make bench-cluster`: prioritize on a history shaped like a large CI installation.

    python -m tools.bench.cluster [--rows 1000000] [--labels 10000] [--quick]
                                  [--backends sqlite,postgres]

The shape is the one the watcher writes (`history.ledger`, `labels.placement_keys`):
`--labels` pipelines (`{ci}-{language}-{tool}-p00042`) on 5 000 live nodes, each
placed on its own hundred-odd nodes (a fifth of them gone since: node churn). Each
(pipeline, node) counts under the pipeline's four segments, its four path prefixes
(`jenkins-*` ... `jenkins-java-maven-p00042-*`) and its pipeline key
(`...-p00042$`), with the recency (`decayed_weight`, `decayed_at`) its placements
left; keys shared by many pipelines add their rows up as the ledger's upsert does.
The default gives about 1 M segment rows beside 2.5 M label-path rows, ledger rows
for a fifth of them and 5 000 pods running. Each call names 1 000 candidate nodes
drawn at random, for a pipeline label drawn at random (the last `10 * calls`
pipelines are kept for `new labels`). Cases, each beside the floor app (the same
body answered by a bare orjson WSGI app) in alternating rounds:

- `one label`: the same label on every call;
- `random labels`: labels drawn from `--labels` pipelines;
- `new labels`: labels no call has asked about before;
- `random + writes`: random labels while a writer records 100 placements a second
  (and finishes as many) with 5 000 pods running; the writer reports what
  `record_placement` cost meanwhile;
- `record_placement` on a quiet machine, after the servers stop: blocks of 100
  placements with 5 000 pods running and with none, alternating (the target: at
  most twice as much with them, at p50; both measured alike, so the ratio is the
  running pods' cost, not the CPU the servers took);
- memory: each extender worker's RSS after the random labels, and again after
  candidates and placements move to nodes that replace the old ones (churn);
  the target is at most 300 MiB, and at most 10 % more after churn.

Every latency is also a ratio to the floor's p50 in the same run. A table goes to
stdout and everything to bench-results/cluster.json.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import orjson

from history.labels import placement_keys
from tools.bench import data
from tools.bench.run import (
    PRIORITIZE_PATH,
    REPO,
    build_request,
    call,
    percentile,
    server_env,
    start_gunicorn,
    stop,
)

GENERAL = data.CI_SYSTEMS + data.LANGUAGES + data.TOOLS  # 17 keys
NODES = 5000
CANDIDATES = 1000
RUNNING = 5000
WRITES_PER_SECOND = 100
RSS_TARGET_MIB = 300
DAY = 86400.0
# KSSCHED_HALF_LIFE_DAYS's default: the recency the loaded rows carry.
HALF_LIFE_DAYS = 7.0
# --quick: a history small enough for a test run.
QUICK_ROWS = 60_000
QUICK_LABELS = 1_000
CHURN_GROWTH = 1.1
# record_placement with 5 000 pods running, as a multiple of its cost with none.
RECORD_TARGET = 2.0
# Targets: (p50, p99) as multiples of the floor's p50.
TARGETS = {
    "one label": (3.0, 10.0),
    "random labels": (3.0, 10.0),
    "new labels": (5.0, None),
}


@functools.cache
def live_nodes() -> list[str]:
    return data.node_names(NODES)


def gone_nodes(count: int) -> list[str]:
    return [f"gone-{index:05d}.pool.example" for index in range(count)]


def new_nodes(count: int) -> list[str]:
    return [f"new-{index:05d}.pool.example" for index in range(count)]


def pipeline(index: int) -> str:
    """A pipeline label: `{ci}-{language}-{tool}-p{index}`."""
    rng = random.Random(index)
    return (
        f"{rng.choice(data.CI_SYSTEMS)}-{rng.choice(data.LANGUAGES)}-"
        f"{rng.choice(data.TOOLS)}-p{index:05d}"
    )


def history_rows(segment_rows: int, pipelines: int, now: float, seed: int = 5):
    """(key, node, count, decayed_weight, decayed_at) rows as the watcher's ledger
    writes them (`labels.placement_keys`): each pipeline placed on its own few
    dozen nodes (a fifth of them gone since) counts under its segments, its path
    prefixes (`jenkins-*`, `jenkins-java-*`, `jenkins-java-maven-*`,
    `jenkins-java-maven-p00042-*`) and its pipeline key (`...-p00042$`), with the
    recency its placements left. Rows of keys many pipelines share (the general
    segments and prefixes) add up their pipelines' rows as the ledger's upsert does.

    About `segment_rows` segment rows (each pipeline's project segment on its
    nodes, and the shared segments) and 2.5 times as many label-path rows."""
    rng = random.Random(seed)
    nodes, gone = live_nodes(), gone_nodes(NODES)
    half_life = HALF_LIFE_DAYS * DAY
    shared: dict[tuple[str, str], tuple[int, float, float]] = {}
    # A tenth of the segment rows are the shared segments.
    per_pipeline = max(1, segment_rows * 9 // (pipelines * 10))
    for index in range(pipelines):
        label = pipeline(index)
        keys = placement_keys(label)
        own = [key for key in keys if key.startswith(label) or key == keys[3]]
        general = [key for key in keys if key not in own]
        chosen: set[str] = set()
        for _ in range(per_pipeline):
            node = rng.choice(gone) if rng.random() < 0.2 else rng.choice(nodes)
            if node in chosen:
                continue
            chosen.add(node)
            count = rng.randint(1, 60)
            # The last placement: recent on live nodes, before the node went on
            # gone ones; the weight what `count` runs left at that instant.
            age = rng.expovariate(1 / 3) if not node.startswith("gone") else 0.0
            age = DAY * (age if age else rng.uniform(10, 60))
            at = now - min(age, 90 * DAY)
            weight = min(float(count), 1.0 + rng.random() * count / 4)
            for key in own:
                yield key, node, count, weight, at
            for key in general:
                before = shared.get((key, node))
                if before is None:
                    shared[key, node] = (count, weight, at)
                    continue
                total, old_weight, old_at = before
                late = max(at, old_at)
                shared[key, node] = (
                    total + count,
                    old_weight * 0.5 ** ((late - old_at) / half_life)
                    + weight * 0.5 ** ((late - at) / half_life),
                    late,
                )
    for (key, node), (count, weight, at) in shared.items():
        yield key, node, count, weight, at


def prepare(rows: int, pipelines: int) -> str:
    """Migrate and load the database of this process's environment (a subprocess
    per backend); return its vendor."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "kssched.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections
    from django.utils import timezone

    from history.models import KeyNode, Placement

    call_command("migrate", verbosity=0, interactive=False)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # A bulk load: the change log's triggers stay quiet, caches start empty.
            cursor.execute("SET session_replication_role = replica")
        loaded = time.time()
        placed_at = timezone.now()
        batch = []
        for key, node, count, weight, at in history_rows(rows, pipelines, loaded):
            batch.append(
                KeyNode(
                    key=key,
                    node=node,
                    count=count,
                    decayed_weight=weight,
                    decayed_at=at,
                    last_placed_at=placed_at - timedelta(seconds=loaded - at),
                )
            )
            if len(batch) >= 20000:
                KeyNode.objects.bulk_create(batch)
                batch = []
        KeyNode.objects.bulk_create(batch)
        now = timezone.now()
        rng = random.Random(3)
        nodes = live_nodes()
        ledger_rows = KeyNode.objects.count() // 5
        placements = [
            Placement(
                pod_uid=f"bench-{index}",
                namespace="ci",
                name=f"bench-{index}",
                label=pipeline(rng.randrange(pipelines)),
                node=rng.choice(nodes),
                bound_at=now,
                finished_at=None if index < RUNNING else now,
            )
            for index in range(ledger_rows)
        ]
        Placement.objects.bulk_create(placements, batch_size=20000)
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = origin")
            cursor.execute("VACUUM (ANALYZE)")
        else:
            cursor.execute("ANALYZE")
    vendor = connection.vendor
    connections.close_all()
    return vendor


def reset_running() -> None:
    """The pods a loaded history starts with running again (an earlier run's
    writer and record pass finished them)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "kssched.settings"
    import django

    django.setup()
    set_running(True)


def set_running(running: bool) -> None:
    """RUNNING of the loaded history's pods running (`running`), or none at all."""
    from django.db import transaction
    from django.utils import timezone

    from history.models import Placement

    with transaction.atomic():
        Placement.objects.filter(finished_at__isnull=True).update(
            finished_at=timezone.now()
        )
        if running:
            Placement.objects.filter(
                pod_uid__in=[f"bench-{index}" for index in range(RUNNING)]
            ).update(finished_at=None)


def timed_placement(uid: str, rng: random.Random, pipelines: int) -> float:
    """Record one placement of a random pipeline on a random live node; its cost."""
    from history import ledger

    label, node = pipeline(rng.randrange(pipelines)), rng.choice(live_nodes())
    before = time.perf_counter()
    ledger.record_placement(
        pod_uid=uid, namespace="ci", name=uid, label=label, node=node
    )
    return time.perf_counter() - before


def write(seconds: float, rate: float, pipelines: int, out: str) -> None:
    """Record `rate` placements a second for `seconds` (finishing the oldest
    running pods as many), then write record_placement's timings to `out`."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "kssched.settings"
    import django

    django.setup()
    from history import ledger
    from history.models import Placement

    rng = random.Random(11)
    running = list(
        Placement.objects.filter(finished_at__isnull=True)
        .order_by("id")
        .values_list("pod_uid", flat=True)
    )
    timings = []
    started = time.monotonic()
    index = 0
    while time.monotonic() - started < seconds:
        due = started + index / rate
        if (pause := due - time.monotonic()) > 0:
            time.sleep(pause)
        uid = f"write-{os.getpid()}-{index}"
        timings.append(timed_placement(uid, rng, pipelines))
        running.append(uid)
        ledger.finish_placement(pod_uid=running.pop(0))
        index += 1
    Path(out).write_bytes(orjson.dumps({"record_placement": timings}))


def record_cost(pipelines: int) -> dict[str, list[float]]:
    """record_placement with RUNNING pods running and with none, on a quiet machine:
    blocks of 100 placements, alternating, three of each (the pair the target
    compares; each placement is finished at once, so the running count holds)."""
    from history import ledger

    rng = random.Random(13)
    timings: dict[str, list[float]] = {"running": [], "idle": []}
    for block in range(6):
        state = "running" if block % 2 == 0 else "idle"
        set_running(state == "running")
        for index in range(100):
            uid = f"record-{os.getpid()}-{block}-{index}"  # new to the ledger
            timings[state].append(timed_placement(uid, rng, pipelines))
            ledger.finish_placement(pod_uid=uid)
    set_running(False)
    return timings


def body(label: str, rng: random.Random, nodes: list[str]) -> bytes:
    pod = data.make_pod(label)
    names = rng.sample(nodes, CANDIDATES)
    return build_request(
        PRIORITIZE_PATH,
        orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}),
    )


def timed(port: int, request: bytes) -> float:
    started = time.perf_counter()
    status, _ = call(port, request)
    if status != 200:
        raise RuntimeError(f"status {status}")
    return time.perf_counter() - started


def ms(values: list[float], fraction: float) -> float:
    return percentile(sorted(values), fraction) * 1000


def rss_of_workers(master: int) -> list[int]:
    """RSS in bytes of each child of a gunicorn master."""
    found = []
    for child in Path("/proc").iterdir():
        if not child.name.isdigit():
            continue
        try:
            status = (child / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("PPid", "").strip() == str(master):
            found.append(int(fields["VmRSS"].split()[0]) * 1024)
    return found


def run_backend(vendor: str, env: dict, floor: int, options, workdir: Path) -> dict:
    rng = random.Random(17)
    nodes = live_nodes()
    server, port = start_gunicorn("kssched.wsgi", env, workdir / f"app-{vendor}.log")
    found: dict = {"cases": {}}
    n = 60 if options.quick else 400
    try:
        # The last 10 * n pipelines are asked about only as `new labels`.
        asked = options.labels - 10 * n
        labels = [pipeline(rng.randrange(asked)) for _ in range(n * 4)]
        cases = {
            "one label": [body(labels[0], rng, nodes) for _ in range(n)],
            "random labels": [body(label, rng, nodes) for label in labels[:n]],
        }
        # Warm the workers on the labels, as a running scheduler would be.
        for request in cases["random labels"] * 2:
            timed(port, request)
        fresh = iter(range(asked, options.labels))
        cases["new labels"] = [
            body(pipeline(next(fresh)), rng, nodes) for _ in range(n)
        ]
        for name, requests in cases.items():
            print(f"  {vendor} {name} ...", flush=True)
            app, base = [], []
            for request in requests:
                base.append(timed(floor, request))
                app.append(timed(port, request))
            found["cases"][name] = summary(app, base, TARGETS.get(name))
        print(f"  {vendor} random + writes ...", flush=True)
        seconds = 20 if options.quick else 40
        out = workdir / f"writes-{vendor}.json"
        writer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tools.bench.cluster",
                "--write",
                str(seconds),
                "--labels",
                str(options.labels),
                "--out",
                str(out),
            ],
            cwd=REPO,
            env=env,
        )
        app, base = [], []
        time.sleep(2)
        while writer.poll() is None:
            request = body(labels[rng.randrange(n * 4)], rng, nodes)
            base.append(timed(floor, request))
            app.append(timed(port, request))
        if writer.returncode != 0:
            raise RuntimeError("the writer failed")
        quiet = found["cases"]["random labels"]["p50_ms"]
        writes = summary(app, base, None)
        writes["p50_over_without_writes"] = round(writes["p50_ms"] / quiet, 2)
        found["cases"]["random + writes"] = writes
        recorded = orjson.loads(out.read_bytes())["record_placement"]
        found["record_placement_ms"] = {
            "under_writes_p50": round(ms(recorded, 0.5), 3),
            "under_writes_p99": round(ms(recorded, 0.99), 3),
        }
        found["rss_mib_after_labels"] = [
            round(value / 2**20) for value in rss_of_workers(server.pid)
        ]
        print(f"  {vendor} node churn ...", flush=True)
        churned = new_nodes(NODES // 2) + nodes[NODES // 2 :]
        for label in labels:
            timed(port, body(label, rng, churned))
        found["rss_mib_after_churn"] = [
            round(value / 2**20) for value in rss_of_workers(server.pid)
        ]
    finally:
        stop(server)
    return found


def summary(app: list[float], base: list[float], target) -> dict:
    floor = ms(base, 0.5)
    found = {
        "n": len(app),
        "floor_p50_ms": round(floor, 3),
        "p50_ms": round(ms(app, 0.5), 3),
        "p99_ms": round(ms(app, 0.99), 3),
        "p50_ratio": round(ms(app, 0.5) / floor, 2),
        "p99_ratio": round(ms(app, 0.99) / floor, 2),
    }
    if target:
        p50, p99 = target
        found["met"] = found["p50_ratio"] <= p50 and (
            p99 is None or found["p99_ratio"] <= p99
        )
    return found


def table(results: dict) -> str:
    lines = [
        f"{'backend':<10} {'case':<16} | {'floor':>6} | {'p50':>7} {'p99':>8} | "
        f"{'p50/fl':>6} {'p99/fl':>6} | target"
    ]
    for vendor, found in results.items():
        for name, case in found["cases"].items():
            verdict = {True: "met", False: "MISSED"}.get(case.get("met"), "-")
            if name == "random + writes":
                ratio = case["p50_over_without_writes"]
                verdict = f"{ratio}x quiet " + ("met" if ratio <= 2 else "MISSED")
            lines.append(
                f"{vendor:<10} {name:<16} | {case['floor_p50_ms']:>6.2f} | "
                f"{case['p50_ms']:>7.2f} {case['p99_ms']:>8.2f} | "
                f"{case['p50_ratio']:>6.2f} {case['p99_ratio']:>6.2f} | {verdict}"
            )
        labels, churn = found["rss_mib_after_labels"], found["rss_mib_after_churn"]
        rss_met = (
            max(labels + churn) <= RSS_TARGET_MIB
            and max(churn) <= max(labels) * CHURN_GROWTH
        )
        lines.append(
            f"{vendor:<10} worker RSS MiB after labels {labels}, after churn {churn} "
            + ("met" if rss_met else "MISSED")
        )
        record = found["record_placement_ms"]
        lines.append(
            f"{vendor:<10} record_placement ms, quiet: p50 {record['idle_p50']} with "
            f"no pod running, {record['running_5000_p50']} with 5000 "
            + (
                "met"
                if record["running_5000_p50"] <= RECORD_TARGET * record["idle_p50"]
                else "MISSED"
            )
            + f"; while serving random + writes: p50 {record['under_writes_p50']} "
            f"(p99 {record['under_writes_p99']})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--labels", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backends", default="sqlite")
    parser.add_argument("--out", default=str(REPO / "bench-results" / "cluster.json"))
    parser.add_argument(
        "--sqlite-path",
        help="the SQLite file to use (default: a new one in a temporary directory)",
    )
    parser.add_argument(
        "--no-load",
        action="store_true",
        help="use the databases as they are (loaded by an earlier run): runs of two "
        "checkouts can then alternate on the same history",
    )
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--write", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--running", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.quick:
        options.rows = min(options.rows, QUICK_ROWS)
        options.labels = min(options.labels, QUICK_LABELS)
    if options.prepare:
        print(prepare(options.rows, options.labels))
        return 0
    if options.running:
        reset_running()
        return 0
    if options.write:
        write(options.write, WRITES_PER_SECOND, options.labels, options.out)
        return 0
    if options.record:
        os.environ["DJANGO_SETTINGS_MODULE"] = "kssched.settings"
        import django

        django.setup()
        timings = record_cost(options.labels)
        print(
            orjson.dumps({state: ms(t, 0.5) for state, t in timings.items()}).decode()
        )
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="kssched-cluster-"))
    floor_env = server_env(workdir)
    floor_env.pop("DATABASE_URL", None)
    floor, floor_port = start_gunicorn(
        "tools.bench.floor:application", floor_env, workdir / "floor.log"
    )
    results = {}
    try:
        for backend in options.backends.split(","):
            env = server_env(workdir)
            env["KSSCHED_SCORING"] = os.environ.get("KSSCHED_SCORING", "warm")
            env["DATA_PATH"] = options.sqlite_path or str(workdir / f"{backend}.db")
            if backend == "sqlite":
                env.pop("DATABASE_URL", None)
            elif not env.get("DATABASE_URL"):
                raise SystemExit("--backends postgres needs DATABASE_URL")
            if options.no_load:
                step = ["--running"]
            else:
                print(f"loading {options.rows} rows into {backend} ...", flush=True)
                step = ["--prepare", "--rows", str(options.rows)]
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tools.bench.cluster",
                    *step,
                    "--labels",
                    str(options.labels),
                ],
                env=env,
                cwd=REPO,
                check=True,
            )
            found = run_backend(backend, env, floor_port, options, workdir)
            quiet = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tools.bench.cluster",
                    "--record",
                    "--labels",
                    str(options.labels),
                ],
                env=env,
                cwd=REPO,
                check=True,
                capture_output=True,
                text=True,
            )
            costs = orjson.loads(quiet.stdout.splitlines()[-1])
            found["record_placement_ms"]["idle_p50"] = round(costs["idle"], 3)
            found["record_placement_ms"]["running_5000_p50"] = round(
                costs["running"], 3
            )
            results[backend] = found
    finally:
        stop(floor)
    print(table(results))
    out = Path(options.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
