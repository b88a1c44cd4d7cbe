"""gunicorn settings for both listeners of ks-scheduler.

`python -m kssched.serve` starts two gunicorn processes with this file, each with
its own workers:

- the web listener (`KSSCHED_LISTENER=web`, the default): admin, history API,
  /metrics, probes, /version and the webhook on `KSSCHED_BIND` (0.0.0.0:8080);
- the extender listener (`KSSCHED_LISTENER=extender`): the `/scheduler/` routes
  kube-scheduler calls, on `KSSCHED_EXTENDER_BIND` (127.0.0.1:8081, loopback only).

Both are served by `kssched.workers.DeadlineWorker`, gunicorn's gevent worker with
a deadline per connection: a connection whose TLS handshake and whole request have
not arrived within the listener's read timeout (`KSSCHED_WEB_READ_TIMEOUT`, 10 s;
`KSSCHED_EXTENDER_READ_TIMEOUT`, 2 s) is closed, and a stalled client holds only a
greenlet on either. The settings come from `kssched.config`.

`gunicorn -c kssched/gunicorn_conf.py kssched.wsgi` alone still serves the web
listener (which answers the extender routes too, to loopback callers).

Workers answer `Connection: close`, so kube-scheduler never reuses a connection that
gunicorn is about to close (a reused POST that fails is not retried by Go).
"""

import functools
import os
import shutil
import ssl
import tempfile
from typing import Any

from gunicorn import glogging

from kssched import config as kssched_config
from kssched import variables
from kssched.serve import empty_metrics_directory

# Every variable, parsed in the master before any worker forks: a bad value stops
# gunicorn with one line naming it (SystemExit passes gunicorn's config loader,
# which would print a traceback for any other exception). Under kssched.serve, which
# has checked and warned already, unknown KSSCHED_* variables are not warned again.
_ENV = dict(os.environ)
if _ENV.get(kssched_config.METRICS_DIR_READY) == "1":
    try:
        variables.read(_ENV)
    except variables.SettingError as exc:
        raise SystemExit(variables.PREFIX + str(exc)) from None
else:
    variables.check(_ENV)
SETTINGS = kssched_config.load()
LISTENER = SETTINGS.listener

# The gevent worker loads the application only with this set (wsgi.py sets it too
# late for it); the same default as manage.py and kssched/wsgi.py.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kssched.settings")

# TLS, matching kube-scheduler's `enableHTTPS` + `tlsConfig` (certFile, keyFile,
# caFile). With a CA, a client without a certificate signed by it fails the
# handshake; the extender routes then also answer callers outside the pod.
if SETTINGS.tls_cert_file:
    certfile = SETTINGS.tls_cert_file
    keyfile = SETTINGS.tls_key_file or None
    if SETTINGS.tls_ca_file:
        ca_certs = SETTINGS.tls_ca_file
        cert_reqs = ssl.CERT_REQUIRED


def ssl_context(conf: Any, default_ssl_context_factory: Any) -> ssl.SSLContext:
    """gunicorn's context, wrapping connections without their handshake: the worker
    runs it within the connection's read deadline (gevent's server would run it
    before, with no deadline, so a stalled handshake would hold a greenlet)."""
    context: ssl.SSLContext = default_ssl_context_factory()
    context.wrap_socket = functools.partial(  # type: ignore[method-assign]
        context.wrap_socket, do_handshake_on_connect=False
    )
    return context


# Both listeners: gevent workers that read each request within a deadline
# (kssched.workers.DeadlineWorker), so stalled clients hold no worker. gevent
# patches threads too: `threading.local` is then per greenlet, and so are Django's
# database connections (one connection shared by greenlets hung on PostgreSQL).
worker_class = "kssched.workers.DeadlineWorker"
# Connections (greenlets) per worker; past them, connections wait in the listen queue.
worker_connections = 1000
# Application greenlets per worker: each runs the requests read whole one at a time,
# with its own database connection (the history cache is one per process). kube-
# scheduler calls the extender one at a time. On the web listener with PostgreSQL a
# second one runs while the first waits for the database, for the API server's
# concurrent reviews; SQLite never yields to gevent, so a second one would only wait
# its turn.
_POSTGRES = variables.read(_ENV)["DATABASE_URL"].startswith(("postgres", "pgsql"))
threads = 2 if LISTENER == "web" and _POSTGRES else 1
# Seconds a connection waits for its next request (0: one request per connection).
# Longer than Go's 90 s idle timeout (kube-scheduler's and the API server's clients):
# the client closes an idle connection first, so a call is never sent on one that
# gunicorn is closing. A stopping worker closes its idle connections at once.
keepalive = SETTINGS.keepalive
if LISTENER == "extender":
    # On loopback only, unless gunicorn verifies client certificates (checked by
    # kssched.variables).
    bind = SETTINGS.extender_bind
    workers = SETTINGS.extender_workers
else:
    bind = SETTINGS.bind
    workers = SETTINGS.web_workers

# A request that takes longer than this is a bug: kube-scheduler gives up after its
# httpTimeout (3 s in deploy/) anyway.
timeout = SETTINGS.worker_timeout
# Keep below the pod's terminationGracePeriodSeconds so in-flight requests finish.
graceful_timeout = SETTINGS.graceful_timeout

# No runtime control socket: two gunicorns would share its default path, and
# nothing in ks-scheduler uses it.
control_socket_disable = True

# No preloading: no database connection may cross a fork (SQLite forbids it).
preload_app = False
max_requests = 0

# Off unless KSSCHED_ACCESS_LOG=1 (the logger class makes `logconfig_dict` below,
# which sets the format, respect that).
accesslog = "-" if SETTINGS.access_log else None


class Logger(glogging.Logger):  # type: ignore[misc]
    """gunicorn's logger, with the access log on only when `accesslog` is set.

    gunicorn logs every request as soon as `logconfig_dict` is given (it is, for the
    log format), whatever `accesslog` says: that would be a line per kube-scheduler
    call and per probe with KSSCHED_ACCESS_LOG=0.
    """

    @property
    def access_log_enabled(self) -> bool:
        return bool(self.cfg.accesslog)


logger_class = Logger
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "generic": {"format": "%(asctime)s %(levelname)s gunicorn: %(message)s"},
        "json": {"()": "kssched.logformat.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stdout",
            "formatter": "json" if SETTINGS.log_format == "json" else "generic",
        },
    },
    "loggers": {
        "gunicorn.error": {
            "handlers": ["console"],
            "level": "INFO",
            "propagate": False,
        },
        "gunicorn.access": {
            "handlers": ["console"],
            "level": "INFO",
            "propagate": False,
        },
    },
}


# Both listeners' workers write their metrics to one directory, so /metrics on the
# web listener adds up all of them. `python -m kssched.serve` prepares it for both;
# a gunicorn started alone makes a private one when none is set.
_private_metrics_dir = None
if not SETTINGS.metrics_dir:
    _private_metrics_dir = tempfile.mkdtemp(prefix="kssched-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _private_metrics_dir


def on_starting(server: Any) -> None:
    """Start with an empty metrics directory, unless kssched.serve has prepared it
    for both listeners (then the other one may already be writing there)."""
    now = kssched_config.load()
    if not now.metrics_dir_ready:
        empty_metrics_directory(now.metrics_dir)


def on_exit(server: Any) -> None:
    if _private_metrics_dir:
        shutil.rmtree(_private_metrics_dir, ignore_errors=True)


def child_exit(server: Any, worker: Any) -> None:
    """Drop a dead worker's live gauges from the multiprocess metrics."""
    if kssched_config.load().metrics_dir:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def post_worker_init(worker: Any) -> None:
    """Warm the worker's history cache before it serves (`extender.warmup`), within
    half the worker timeout, with a heartbeat after each label. Not for another
    application served with this file (Django not set up: nothing to warm)."""
    from django.apps import apps
    from django.conf import settings

    if not apps.ready:
        return
    seconds = min(settings.KSSCHED_WARM_START_SECONDS, SETTINGS.worker_timeout / 2)
    if seconds > 0:
        from extender.warmup import warm_start

        warm_start(seconds=seconds, notify=worker.notify)


def post_fork(server: Any, worker: Any) -> None:
    """Start each worker without database connections inherited from the master."""
    from django.conf import settings

    if settings.configured:
        from django.db import connections

        connections.close_all()
