"""The fake API server as pytest fixtures (registered in tests/conftest.py).

- ``server``: a running ``FakeApiServer`` in cluster mode, stopped after the test;
- ``api``: the watcher's ``kube.KubeApi`` on the unmodified kubernetes client,
  pointed at ``server`` through a kubeconfig file.

A test module changes them by overriding the small fixtures they take:
``bookmark_interval`` (seconds between bookmarks, None for none) and
``read_timeout`` (the client's, in seconds)::

    @pytest.fixture
    def bookmark_interval():
        return None
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from history.watcher import kube
from tests.fakeapi.kubeconfig import write_kubeconfig
from tests.fakeapi.server import FakeApiServer


@pytest.fixture
def bookmark_interval() -> float | None:
    """Seconds between the server's bookmarks on a watch."""
    return 0.3


@pytest.fixture
def read_timeout() -> float:
    """The client's read timeout, in seconds."""
    return 1.0


@pytest.fixture
def server(bookmark_interval: float | None) -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=bookmark_interval) as fake:
        yield fake


@pytest.fixture
def kubeconfig(server: FakeApiServer, tmp_path: Path) -> Path:
    """A kubeconfig file whose only context is `server`."""
    return write_kubeconfig(tmp_path, server.url)


@pytest.fixture
def api(kubeconfig: Path, read_timeout: float) -> kube.KubeApi:
    client = kube.api_client(kubeconfig=str(kubeconfig))
    return kube.KubeApi(client, connect_timeout=1, read_timeout=read_timeout)
