"""`make bench-e2e`'s report: medians over repeated rounds, default-scheduler's
pods per second read against kube-scheduler's client rate limit, and the CPU that
processes outside the bench took while it ran."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tools.bench import e2e


def _round(nodes, scheduler, watcher, pods_per_second, cpu=0.0, mean=1.0, others=0.0):
    figures = {"mean": mean, "p50": mean, "p99": mean * 4, "count": 200}
    return {
        "nodes": nodes,
        "scheduler": scheduler,
        "watcher": watcher,
        "pods": 200,
        "pods_per_second": pods_per_second,
        "watcher_cpu_per_100": cpu,
        "others_cores": others,
        "algorithm": dict(figures),
        "e2e": dict(figures),
        "extender": dict(figures),
    }


def test_a_round_beyond_the_burst_is_held_to_the_client_rate_limit():
    # 100 pods bind at once (the burst), the other 100 at 50 a second: 2 s.
    assert e2e.rate_limit_ceiling(200) == pytest.approx(100.0)
    assert e2e.rate_limit_ceiling(400) == pytest.approx(400 / 6)
    assert e2e.rate_limit_ceiling(100) == float("inf")
    assert e2e.rate_limit_ceiling(600, qps=100, burst=200) == pytest.approx(150.0)


def test_repeated_rounds_are_reported_by_their_medians():
    rounds = [
        _round(1000, "default-scheduler", "running", 97.0),
        _round(1000, "ks-scheduler", "running", 70.0, cpu=0.3, mean=14.0),
        _round(1000, "default-scheduler", "running", 95.0),
        _round(1000, "ks-scheduler", "running", 84.0, cpu=0.2, mean=12.0),
        _round(1000, "ks-scheduler", "running", 80.0, cpu=0.25, mean=13.0, others=0.4),
    ]
    rows = e2e.median_rows(rounds)
    assert [(r["scheduler"], r["rounds"]) for r in rows] == [
        ("default-scheduler", 2),
        ("ks-scheduler", 3),
    ]
    ks = rows[1]
    assert ks["pods_per_second"] == 80.0
    assert ks["pods_per_second_each"] == [70.0, 84.0, 80.0]
    assert ks["watcher_cpu_per_100"] == 0.25
    assert ks["algorithm"]["mean"] == 13.0
    assert rows[0]["pods_per_second"] == 96.0
    lines = e2e.verdicts(rows)
    assert (
        "1000 nodes, watcher running: extender pods/s = 0.83x default "
        "(target >= 0.85: MISSED)" in lines
    )
    ceiling = [line for line in lines if "client rate limit" in line]
    assert ceiling == [
        "1000 nodes, default-scheduler: 96.0 pods/s, 96% of the 100 pods/s that "
        "kube-scheduler's client rate limit lets a round of 200 pods bind (a burst "
        "of 100, then 50 a second)"
    ]
    # With the limit raised (bench-e2e --client-qps 1000 --client-burst 2000), a
    # round of 200 pods is inside the burst: no ceiling to state.
    raised = e2e.verdicts(rows, qps=1000, burst=2000)
    assert not [line for line in raised if "client rate limit" in line]
    assert "  1000 nodes, ks-scheduler, watcher running: 70.0 / 84.0 / 80.0" in lines
    # The busiest of the repeated rounds stands for them.
    assert ks["others_cores"] == 0.4
    assert (
        f"cores kept busy by processes outside the bench while pods bound: "
        f"0.00-0.40 of {os.cpu_count()} (rows of a busier machine read slower: "
        f"compare rows of one run)" in lines
    )


# A Python program that keeps a core busy for `seconds` of its own CPU time.
BURN = (
    "import time\n"
    "end = time.process_time() + {seconds}\n"
    "while time.process_time() < end: pass\n"
)


def _burnt(marker, seconds=30):
    """The pid a burner wrote to `marker` once it had burnt its CPU."""
    deadline = time.monotonic() + seconds
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the burner did not burn its CPU"
        time.sleep(0.05)
    return int(marker.read_text())


def _burner(marker):
    """Burn 0.5 s of CPU, write the pid to `marker`, then wait to be stopped."""
    return BURN.format(seconds=0.5) + (
        f"open({str(marker)!r}, 'w').write(str(__import__('os').getpid()))\n"
        "time.sleep(30)\n"
    )


def test_the_bench_tells_its_own_cpu_from_other_processes(tmp_path):
    """Process trees read from /proc: a running child's CPU is the bench's own, the
    CPU of a process outside the tree (an orphan, adopted by init) only the
    machine's."""
    busy, ours = e2e.machine_busy_seconds(), e2e.tree_seconds(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", _burner(tmp_path / "child")])
    try:
        _burnt(tmp_path / "child")
        assert e2e.tree_seconds(os.getpid()) - ours >= 0.45  # not reaped yet
    finally:
        child.kill()
        child.wait()

    marker = tmp_path / "orphan"
    # The parent starts the burner and exits at once, leaving it out of our tree.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; "
            f"subprocess.Popen([sys.executable, '-c', {_burner(marker)!r}])",
        ],
        check=True,
    )
    ours, busy_mid = e2e.tree_seconds(os.getpid()), e2e.machine_busy_seconds()
    orphan = _burnt(marker)
    try:
        mine = e2e.tree_seconds(os.getpid()) - ours
        machine = e2e.machine_busy_seconds() - busy_mid
        assert mine < 0.3, mine
        assert machine - mine >= 0.3, (machine, mine)
        assert e2e.others_cores(machine, mine, 1.0) >= 0.3
    finally:
        os.kill(orphan, signal.SIGKILL)
    assert e2e.machine_busy_seconds() - busy >= 0.9
    assert e2e.others_cores(1.0, 2.0, 1.0) == 0.0
    assert e2e.others_cores(3.0, 1.0, 4.0) == 0.5
