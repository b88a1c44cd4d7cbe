"""Passes over the whole ledger hold one node at a time: four times the history (on
four times the nodes) takes no more memory. Each pass runs in a fresh process on a
real SQLite file (`tools.bench.migration_memory`), whose peak RSS it reports."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PASSES = ("migration_0013", "audit_counts", "prune_placements")


def peaks(placements: int, nodes: int) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.bench.migration_memory",
            "--placements",
            str(placements),
            "--nodes",
            str(nodes),
            "--pipelines",
            str(placements // 4),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    found = dict(re.findall(r"(\w+) +peak RSS +([\d.]+) MiB", done.stdout))
    assert set(found) == set(PASSES), done.stdout + done.stderr
    return {name: float(mib) for name, mib in found.items()}


@pytest.mark.slow
def test_memory_does_not_grow_with_the_ledger():
    small, large = peaks(6000, 150), peaks(24000, 600)
    for name in PASSES:
        # Holding every (key, node) pair, 24 000 placements took 20 MiB more.
        assert large[name] - small[name] < 6, (name, small, large)
