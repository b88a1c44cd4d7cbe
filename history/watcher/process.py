"""The watcher process: the pod stream, the node thread and optional leadership.

`manage.py watch_pods` builds a `Watcher` and wires signals to `request_shutdown`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, close_old_connections, connection

from history.exceptions import WatcherFatalError
from history.watcher import housekeeping, state
from history.watcher.heartbeat import Heartbeat
from history.watcher.kube import KubeApi
from history.watcher.lease import LeaderElector
from history.watcher.loop import Stream
from history.watcher.nodes import NodeHandler
from history.watcher.options import Options
from history.watcher.placement_events import PlacementEvents
from history.watcher.pods import PodHandler

logger = logging.getLogger(__name__)

# With --once, the watch after the list (or from the checkpoint) lasts this long on
# the server: it delivers the events already queued, then ends.
ONCE_WATCH_SECONDS = 1


class Watcher:
    """The whole watcher process: pod stream, node thread, optional leadership."""

    def __init__(
        self,
        api: KubeApi,
        *,
        options: Options,
        heartbeat: Heartbeat,
        watch_nodes: bool = True,
        elector: LeaderElector | None = None,
        once: bool = False,
        shutdown: threading.Event | None = None,
        events: PlacementEvents | None = None,
    ) -> None:
        self.api = api
        self.events = events
        self.options = options
        self.heartbeat = heartbeat
        self.watch_nodes = watch_nodes
        self.elector = elector
        self.once = once
        self.shutdown = shutdown or threading.Event()
        self._leading = threading.Event()
        self.pods: Stream | None = None
        self.nodes: Stream | None = None

    def request_shutdown(self, *_: Any) -> None:
        """Signal handler: stop soon; unblock any open watch."""
        self.shutdown.set()
        for stream in (self.pods, self.nodes):
            if stream is not None:
                stream.interrupt()

    def run(self) -> None:
        try:
            self._run()
        finally:
            if self.events is not None:
                self.events.close()

    def _run(self) -> None:
        if self.elector is None:
            self._run_streams(lost=None)
            return
        try:
            while not self.shutdown.is_set():
                if not self._stand_by():
                    break
                lost = threading.Event()
                renewer = threading.Thread(
                    target=self._renew, args=(lost,), name="lease-renew", daemon=True
                )
                renewer.start()
                self._set_holder(self.elector.identity)
                try:
                    self._run_streams(lost=lost)
                finally:
                    lost.set()
                    renewer.join(timeout=self.elector.retry_period + 5)
                if self.once or self.shutdown.is_set():
                    break
                logger.warning("Lost the lease; standing by")
        finally:
            self.elector.release()

    def _stand_by(self) -> bool:
        """Wait until this replica holds the lease; False on shutdown."""
        assert self.elector is not None
        logged = False
        while not self.shutdown.is_set():
            if self.elector.try_acquire():
                return True
            if not logged:
                logger.info(
                    "Standing by: lease %s is held by another replica",
                    self.elector.name,
                )
                logged = True
            self.heartbeat.beat()
            if self.shutdown.wait(self.elector.retry_period):
                return False
        return False

    def _renew(self, lost: threading.Event) -> None:
        elector = self.elector
        assert elector is not None
        while not lost.wait(elector.retry_period):
            if elector.try_acquire():
                continue
            if time.monotonic() - elector.last_renewed > elector.renew_deadline:
                logger.warning("Could not renew lease %s in time", elector.name)
                lost.set()
                for stream in (self.pods, self.nodes):
                    if stream is not None:
                        stream.interrupt()
                return

    def _set_holder(self, holder: str) -> None:
        try:
            state.save_watch_state(name=state.PODS, holder=holder)
        except DatabaseError as exc:
            logger.warning("Cannot record the lease holder: %s", exc)
        finally:
            close_old_connections()

    def _run_streams(self, lost: threading.Event | None) -> None:
        stop = threading.Event()

        def until() -> bool:
            return stop.is_set() or (lost is not None and lost.is_set())

        self.pods = Stream(
            self.api,
            PodHandler(self.options, events=self.events),
            options=self.options,
            shutdown=self.shutdown,
            heartbeat=self.heartbeat,
            max_events=self.options.max_events,
        )
        node_thread = None
        wake = threading.Event()
        if not self.once:
            housekeeping.start(until, wake)
        if self.watch_nodes and not self.once:
            self.nodes = Stream(self.api, NodeHandler(), options=self.options)
            node_thread = threading.Thread(
                target=self._run_nodes, args=(until,), name="nodes", daemon=True
            )
            node_thread.start()
        try:
            self.pods.start()
            if self.once:
                if not self.pods.watch_once(server_timeout=ONCE_WATCH_SECONDS):
                    logger.warning("The single watch pass ended with a fault")
            else:
                self.pods.run(until=until)
        finally:
            stop.set()
            wake.set()
            if self.nodes is not None:
                self.nodes.shutdown.set()
                self.nodes.interrupt()
            if node_thread is not None:
                node_thread.join(timeout=10)

    def _run_nodes(self, until: Callable[[], bool]) -> None:
        nodes = self.nodes
        assert nodes is not None
        try:
            nodes.run(until=lambda: until() or self.shutdown.is_set())
        except WatcherFatalError as exc:
            logger.error("Node watch stopped: %s", exc)
        except Exception:
            logger.exception("Node watch stopped")
        finally:
            connection.close()
