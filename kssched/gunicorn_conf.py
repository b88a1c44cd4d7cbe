"""gunicorn settings for both listeners of ks-scheduler.

`python -m kssched.serve` starts two gunicorn processes with this file, each with
its own workers:

- the web listener (`KSSCHED_LISTENER=web`, the default): admin, history API,
  /metrics, probes and /version on `KSSCHED_BIND` (0.0.0.0:8080), sync workers;
- the extender listener (`KSSCHED_LISTENER=extender`): the `/scheduler/` routes
  kube-scheduler calls, on `KSSCHED_EXTENDER_BIND` (127.0.0.1:8081, loopback only),
  served by `kssched.workers.ExtenderWorker`, which reads request heads in its event
  loop and drops a connection whose request has not arrived within
  `KSSCHED_EXTENDER_READ_TIMEOUT` seconds (2).

So a client that stalls on the pod port cannot hold the workers that answer
kube-scheduler. `gunicorn -c kssched/gunicorn_conf.py kssched.wsgi` alone still serves
the web listener (which answers the extender routes too, to loopback callers).

Workers answer `Connection: close`, so kube-scheduler never reuses a connection that
gunicorn is about to close (a reused POST that fails is not retried by Go).
"""

import contextlib
import ipaddress
import os
import shutil
import ssl
import tempfile

from kssched.serve import empty_metrics_directory

LISTENER = os.environ.get("KSSCHED_LISTENER", "web")
if LISTENER not in ("web", "extender"):
    raise RuntimeError(
        f"KSSCHED_LISTENER must be 'web' or 'extender', not {LISTENER!r}"
    )

# TLS, matching kube-scheduler's `enableHTTPS` + `tlsConfig` (certFile, keyFile,
# caFile). With a CA, a client without a certificate signed by it fails the
# handshake; the extender routes then also answer callers outside the pod.
_tls_cert = os.environ.get("KSSCHED_TLS_CERT_FILE", "")
_tls_key = os.environ.get("KSSCHED_TLS_KEY_FILE", "")
_tls_ca = os.environ.get("KSSCHED_TLS_CA_FILE", "")
if (_tls_key or _tls_ca) and not _tls_cert:
    raise RuntimeError(
        "KSSCHED_TLS_KEY_FILE and KSSCHED_TLS_CA_FILE need KSSCHED_TLS_CERT_FILE"
    )
if _tls_cert:
    certfile = _tls_cert
    keyfile = _tls_key or None
    if _tls_ca:
        ca_certs = _tls_ca
        cert_reqs = ssl.CERT_REQUIRED


def _is_loopback_bind(address: str) -> bool:
    if address.startswith("unix:"):
        return True
    host = address.rpartition(":")[0].strip("[]") if ":" in address else address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


if LISTENER == "extender":
    bind = os.environ.get("KSSCHED_EXTENDER_BIND", "127.0.0.1:8081")
    # Only kube-scheduler in the same pod may reach it, unless gunicorn verifies
    # client certificates.
    if not _is_loopback_bind(bind) and not _tls_ca:
        raise RuntimeError(
            f"KSSCHED_EXTENDER_BIND={bind} is not a loopback address: the extender "
            "listener is for kube-scheduler in the same pod (127.0.0.1:PORT), or "
            "needs TLS with client certificates (KSSCHED_TLS_CA_FILE)"
        )
    worker_class = "kssched.workers.ExtenderWorker"
    workers = int(os.environ.get("KSSCHED_EXTENDER_WORKERS", "2"))
else:
    bind = os.environ.get("KSSCHED_BIND", "0.0.0.0:8080")
    worker_class = "sync"
    workers = int(os.environ.get("WEB_CONCURRENCY", "3"))

# A request that takes longer than this is a bug: kube-scheduler gives up after its
# httpTimeout (3 s in deploy/) anyway.
timeout = int(os.environ.get("KSSCHED_WORKER_TIMEOUT", "20"))
# Keep below the pod's terminationGracePeriodSeconds so in-flight requests finish.
graceful_timeout = int(os.environ.get("KSSCHED_GRACEFUL_TIMEOUT", "20"))

# No runtime control socket: two gunicorns would share its default path, and
# nothing in ks-scheduler uses it.
control_socket_disable = True

# No preloading: no database connection may cross a fork (SQLite forbids it).
preload_app = False
max_requests = 0

# Off unless KSSCHED_ACCESS_LOG=1 (the logger class makes `logconfig_dict` below,
# which sets the format, respect that).
accesslog = "-" if os.environ.get("KSSCHED_ACCESS_LOG", "") == "1" else None
logger_class = "kssched.workers.Logger"
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
            "formatter": "json"
            if os.environ.get("KSSCHED_LOG_FORMAT", "").lower() == "json"
            else "generic",
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
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _private_metrics_dir = tempfile.mkdtemp(prefix="kssched-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _private_metrics_dir


def on_starting(server):
    """Start with an empty metrics directory, unless kssched.serve has prepared it
    for both listeners (then the other one may already be writing there)."""
    if os.environ.get("KSSCHED_METRICS_DIR_READY") != "1":
        empty_metrics_directory(os.environ["PROMETHEUS_MULTIPROC_DIR"])


def on_exit(server):
    if _private_metrics_dir:
        shutil.rmtree(_private_metrics_dir, ignore_errors=True)
    if worker_class == "kssched.workers.ExtenderWorker":
        from kssched.workers import acceptor_lock_path

        with contextlib.suppress(OSError):
            os.remove(acceptor_lock_path(server.pid))


def child_exit(server, worker):
    """Drop a dead worker's live gauges from the multiprocess metrics."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def post_fork(server, worker):
    """Start each worker without database connections inherited from the master."""
    from django.conf import settings

    if settings.configured:
        from django.db import connections

        connections.close_all()
