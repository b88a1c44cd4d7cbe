"""gunicorn settings: `gunicorn -c kssched/gunicorn_conf.py kssched.wsgi`.

Sync workers answer `Connection: close`, so kube-scheduler never reuses a connection
that gunicorn is about to close (a reused POST that fails is not retried by Go).
kube-scheduler sends one request at a time; a few workers leave room for probes,
the admin and worker restarts.
"""

import os
import shutil
import ssl
from pathlib import Path

bind = os.environ.get("KSSCHED_BIND", "0.0.0.0:8080")
worker_class = "sync"
workers = int(os.environ.get("WEB_CONCURRENCY", "3"))

# A request that takes longer than this is a bug: kube-scheduler gives up after its
# httpTimeout (5 s by default) anyway.
timeout = int(os.environ.get("KSSCHED_WORKER_TIMEOUT", "20"))
# Keep below the pod's terminationGracePeriodSeconds so in-flight requests finish.
graceful_timeout = int(os.environ.get("KSSCHED_GRACEFUL_TIMEOUT", "20"))

# No preloading: no database connection may cross a fork (SQLite forbids it).
preload_app = False
max_requests = 0

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

accesslog = "-" if os.environ.get("KSSCHED_ACCESS_LOG", "") == "1" else None
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


def on_starting(server):
    """Start with an empty PROMETHEUS_MULTIPROC_DIR: old workers' files would be
    added to the new totals."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        # Empty it rather than delete it: it may be a volume's mount point.
        for entry in directory.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


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
