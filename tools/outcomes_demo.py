"""A scripted outcomes run: pipeline pods with realistic container statuses go through
the fake API server to a real `manage.py watch_pods` process, then `manage.py outcomes`.

`python -m tools.outcomes_demo` (or `make outcomes-demo`) migrates a fresh SQLite file
(or uses DATABASE_URL), starts the watcher as a subprocess against tests/fakeapi/ in
cluster mode and runs pods of three pipelines on twenty nodes: each is bound, pulls
(longer on a node that never ran its pipeline), runs and ends, and a few fail, lose
their times or are deleted while running. Halfway the watcher is killed with SIGKILL
and restarted; at the end it is restarted once more from an old checkpoint, so every
event is replayed. The script works out what the report must say from the pods it
made and exits 1 unless `outcomes --json` says exactly that, then prints `outcomes`.
"""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from history.labels import path_keys, placement_keys
from tests.fakeapi import (
    FakeApiServer,
    make_node,
    make_pod,
    pod_status,
    write_kubeconfig,
)
from tests.helpers import REPO
from tests.watcher_process import WatcherProcess, wait_until, watcher_env

PIPELINES = {  # label: share of the pods
    "jenkins-java-maven": 0.5,
    "gitlab-go-build": 0.3,
    "jenkins-python-pytest": 0.2,
}
NODES = [f"worker-{i:02d}" for i in range(1, 21)]
# Seconds: (startup low, high) by how warm the node is, and the run.
STARTUP = {"exact": (8, 30), "partial": (50, 110), "cold": (160, 320)}
RUN = (380, 560)


class Demo:
    def __init__(self, server: FakeApiServer, rng: random.Random) -> None:
        self.server = server
        self.rng = rng
        self.ran: set[tuple[str, str]] = set()  # (key, node) with history
        self.expected: list[tuple[str, str, str, float | None, float | None]] = []
        self.clock = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
        self.number = 0

    def warmth(self, label: str, node: str) -> str:
        """The ledger's warmth: exact when this pipeline ran on `node`, partial when
        a pipeline sharing a leading run of its segments did, else cold."""
        keys = path_keys(label)
        if (keys[-1], node) in self.ran:
            return "exact"
        return "partial" if any((k, node) in self.ran for k in keys) else "cold"

    def pick_node(self, label: str) -> str:
        # Mostly a warm node, as the extender makes kube-scheduler prefer.
        warm = [n for n in NODES if self.warmth(label, n) == "exact"]
        if warm and self.rng.random() < 0.6:
            return self.rng.choice(warm)
        return self.rng.choice(NODES)

    def pod(self) -> None:
        self.number += 1
        label = self.rng.choices(list(PIPELINES), weights=PIPELINES.values())[0]
        node = self.pick_node(label)
        warmth = self.warmth(label, node)
        self.ran.update((key, node) for key in placement_keys(label))
        name = f"{label}-{self.number}"
        self.clock += timedelta(seconds=self.rng.randint(60, 400))
        bound = self.clock
        startup = self.rng.randint(*STARTUP[warmth])
        run = self.rng.randint(*RUN)
        started = bound + timedelta(seconds=startup)
        finished = started + timedelta(seconds=run)
        fate = self.rng.random()
        self.server.add_pod(make_pod(name, uid=f"uid-{self.number}", label=label))
        self.report(name, node, scheduled=bound)
        self.report(name, node, scheduled=bound, started=started)
        if fate < 0.04:  # deleted while running: no run, no outcome
            self.server.delete_pod(name)
            return
        if fate < 0.07:  # the kubelet's clock runs ahead: the end before the start
            self.report(name, node, scheduled=bound, started=finished, finished=started)
            self.expected.append((label, warmth, "Succeeded", None, None))
            return
        exit_code = 1 if fate < 0.15 else 0
        self.report(
            name,
            node,
            scheduled=bound,
            started=started,
            finished=finished,
            exit_code=exit_code,
        )
        outcome = "Failed" if exit_code else "Succeeded"
        self.expected.append((label, warmth, outcome, startup, run))

    def report(self, name: str, node: str, **status) -> None:
        def change(pod):
            pod["spec"]["nodeName"] = node
            pod["status"] = pod_status(**status)

        self.server.modify_pod(name, change)


def expected_report(rows, since, until) -> dict:
    """The report worked out from the pods made, with history.outcomes' maths."""
    from history.outcomes import WARMTHS, saved_seconds, summarize

    def section(subset):
        return {w: summarize([r[2:] for r in subset if r[1] == w]) for w in WARMTHS}

    pipelines = []
    for label in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == label]
        saved, reason = saved_seconds(
            {w: [r[2:] for r in mine if r[1] == w] for w in WARMTHS}
        )
        pipelines.append(
            {
                "label": label,
                **section(mine),
                "saved_seconds": saved,
                "saved_reason": reason,
            }
        )
    return {
        "overall": section(rows),
        "pipelines": pipelines,
        "since": since,
        "until": until,
    }


def main(argv: list[str] | None = None) -> int:
    pods = int((argv or sys.argv[1:] or ["200"])[0])
    workdir = Path(tempfile.mkdtemp(prefix="ks-outcomes-"))
    env = {
        "SECRET_KEY": "demo-not-a-secret-0123456789abcdefghijklmnopqrstuvwxyz",
        "DEBUG": "0",
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "LOG_LEVEL": "INFO",
    }
    if os.environ.get("DATABASE_URL"):
        env["DATABASE_URL"] = os.environ["DATABASE_URL"]
    else:
        env["DATA_PATH"] = str(workdir / "scheduler.db")
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kssched.settings")
    manage = [sys.executable, "manage.py"]
    subprocess.run(
        [*manage, "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True
    )
    import django

    django.setup()
    import orjson
    from django.core.management import call_command

    from history.models import WatchState
    from history.watcher import state

    with FakeApiServer(bookmark_interval=0.5) as server:
        for node in NODES:
            server.add_node(make_node(node))
        demo = Demo(server, random.Random(11))
        kubeconfig = write_kubeconfig(workdir, server.url)
        wenv = watcher_env(env, kubeconfig, workdir)
        watcher = WatcherProcess(wenv, ["--no-nodes"], workdir / "watcher.log").start()

        def caught_up() -> bool:
            row = WatchState.objects.filter(name="pods").first()
            return bool(row) and row.resource_version == server.resource_version

        # Warmth is judged when the watcher first sees a pod bound, so it watches
        # from the start and sees the bindings in order.
        watcher.wait_ready()
        assert wait_until(lambda: WatchState.objects.filter(name="pods").exists(), 20)
        for _ in range(pods // 2):
            demo.pod()
        watcher.kill()  # SIGKILL halfway; pods keep running meanwhile
        for _ in range(pods - pods // 2):
            demo.pod()
        watcher.start()
        assert wait_until(caught_up, 60), "the watcher did not catch up"
        watcher.stop()
        # Restart from an old checkpoint: every event is replayed.
        state.save_watch_state(name="pods", resource_version="1")
        watcher.start()
        assert wait_until(caught_up, 60), "the replay did not catch up"
        code, _ = watcher.stop()
        assert code == 0, watcher.log

    out = io.StringIO()
    call_command("outcomes", "--json", stdout=out)
    got = orjson.loads(out.getvalue())
    want = expected_report(demo.expected, got["since"], got["until"])
    matches = got == want
    print(f"$ python manage.py outcomes   # {pods} pods, {len(demo.expected)} ended")
    call_command("outcomes")
    print()
    print(f"outcomes --json equals the figures worked out from the pods: {matches}")
    return 0 if matches else 1


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
