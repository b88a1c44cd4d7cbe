"""`manage.py watch_pods`: record every pipeline placement exactly once.

The process lifecycle only: options, signals, metrics endpoint, leader election and
exit status. The loop itself (list, watch from the saved resourceVersion, relist on
410, back off on faults, one transaction per event) is `history.watcher.loop`, the
rule for when a pod counts `history.watcher.pods.decide`.

Exit status: 0 after SIGTERM/SIGINT, `--once` or `--max-events`; 1 when the cluster
configuration is unusable or the database schema is missing.
"""

import logging
import signal
import socket
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from history.exceptions import KubeConfigError, WatcherFatalError
from history.watcher import kube, metrics
from history.watcher.heartbeat import Heartbeat
from history.watcher.lease import LeaderElector
from history.watcher.options import Options
from history.watcher.placement_events import PlacementEvents
from history.watcher.process import Watcher

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Watch pipeline pods and record each placement exactly once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--count-when",
            choices=["bound", "running"],
            default="bound",
            help="Count a pod when it is bound to a node (default) or first Running.",
        )
        parser.add_argument(
            "--namespace", default=None, help="Watch one namespace (default: all)."
        )
        parser.add_argument("--kubeconfig", default=None, help="Kubeconfig file.")
        parser.add_argument("--context", default=None, help="Kubeconfig context.")
        parser.add_argument(
            "--leader-elect",
            action="store_true",
            help="Run only while holding the Lease KSSCHED_LEASE_NAME in "
            "POD_NAMESPACE (replicas stand by).",
        )
        parser.add_argument(
            "--max-events",
            type=int,
            default=None,
            help="Stop after handling this many pod events and list items.",
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="One pass: list (or resume from the checkpoint), take the events "
            "the API server has already queued (a 1 s watch), then stop.",
        )
        parser.add_argument(
            "--no-nodes",
            action="store_true",
            help="Do not watch Node objects (node replacement goes unnoticed).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # manage.py may be PID 1 in its container: register the handlers explicitly,
        # first thing, so a SIGTERM during start-up is a clean stop as well.
        shutdown = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: shutdown.set())
        signal.signal(signal.SIGINT, lambda *_: shutdown.set())
        try:
            client = kube.api_client(
                kubeconfig=options["kubeconfig"], context=options["context"]
            )
        except KubeConfigError as exc:
            raise CommandError(str(exc)) from exc
        api = kube.KubeApi(
            client,
            connect_timeout=settings.KSSCHED_WATCH_CONNECT_TIMEOUT,
            read_timeout=settings.KSSCHED_WATCH_READ_TIMEOUT,
        )
        watch_options = Options.from_settings(
            namespace=options["namespace"],
            count_when=options["count_when"],
            max_events=options["max_events"],
        )
        elector = None
        if options["leader_elect"]:
            namespace = settings.POD_NAMESPACE
            if not namespace:
                raise CommandError("--leader-elect needs POD_NAMESPACE to be set.")
            elector = LeaderElector(
                api,
                name=settings.KSSCHED_LEASE_NAME,
                namespace=namespace,
                identity=settings.POD_NAME or socket.gethostname(),
                duration=settings.KSSCHED_LEASE_DURATION,
                renew_deadline=settings.KSSCHED_LEASE_RENEW_DEADLINE,
                retry_period=settings.KSSCHED_LEASE_RETRY_PERIOD,
            )
        events = None
        if settings.KSSCHED_PLACEMENT_EVENTS:
            events = PlacementEvents(
                api,
                rate=settings.KSSCHED_PLACEMENT_EVENTS_PER_SECOND,
                burst=settings.KSSCHED_PLACEMENT_EVENTS_BURST,
                instance=settings.POD_NAME or socket.gethostname(),
            )
        watcher = Watcher(
            api,
            events=events,
            options=watch_options,
            heartbeat=Heartbeat(settings.KSSCHED_HEARTBEAT_PATH),
            watch_nodes=settings.KSSCHED_WATCH_NODES and not options["no_nodes"],
            elector=elector,
            once=options["once"],
            shutdown=shutdown,
        )
        signal.signal(signal.SIGTERM, watcher.request_shutdown)
        signal.signal(signal.SIGINT, watcher.request_shutdown)
        metrics.serve(settings.KSSCHED_WATCHER_METRICS_BIND)
        logger.info(
            "Watching %s pods of scheduler %s with label %s (count when %s)",
            options["namespace"] or "all",
            watch_options.scheduler_name,
            watch_options.pipeline_label,
            watch_options.count_when,
        )
        try:
            watcher.run()
        except WatcherFatalError as exc:
            raise CommandError(str(exc)) from exc
        logger.info("Stopped")
