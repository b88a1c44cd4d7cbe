"""Fixtures for the end-to-end tests on a real control plane (controlplane.py).

One control plane for the session: etcd, kube-apiserver with the ServiceAccount and
RBAC of deploy/ applied, and a namespace. Each test brings its own nodes (deleted
after it), its own schedulers and its own ks-scheduler processes on the test
database. The only skip allowed is a machine where the Debian source cannot be
had, and then the run says so in its summary.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from tests.e2e.controlplane import ControlPlane, Unavailable, build_binaries
from tests.helpers import REPO

DEPLOY = REPO / "deploy"
RBAC_FILES = (
    "base/serviceaccount.yaml",
    "base/rbac-watcher.yaml",
    "base/rbac-scheduler.yaml",
)
_unavailable: list[str] = []
_names = itertools.count(1)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/e2e/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter):
    if _unavailable:
        terminalreporter.write_sep("!", "END-TO-END TESTS SKIPPED", red=True, bold=True)
        terminalreporter.write_line(
            "The real control plane could not be built here: " + _unavailable[0],
            red=True,
        )


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    try:
        binaries = build_binaries()
    except Unavailable as exc:
        _unavailable.append(str(exc))
        pytest.skip(f"no control plane: {exc}")
    plane = ControlPlane(binaries, workdir=tmp_path_factory.mktemp("control-plane"))
    try:
        plane.start()
        for name in RBAC_FILES:
            plane.apply((DEPLOY / name).read_text())
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def namespace(control_plane) -> str:
    """A namespace of this test's own."""
    name = f"ci-{next(_names)}-{int(time.time()) % 100000}"
    control_plane.ensure_namespace(name)
    return name


@pytest.fixture
def make_nodes(control_plane):
    """make_nodes(n) -> n new Ready nodes, deleted when the test ends."""
    made: list[str] = []
    prefix = f"e2e{next(_names)}"

    def make(count: int, **kw) -> list[str]:
        names = [f"{prefix}-node-{len(made) + i:04d}" for i in range(count)]
        control_plane.create_nodes(names, **kw)
        made.extend(names)
        return names

    yield make
    control_plane.delete_nodes(made)


def deploy_file(relative: str) -> str:
    return (DEPLOY / relative).read_text()


def workdir(tmp_path: Path) -> Path:
    return tmp_path
