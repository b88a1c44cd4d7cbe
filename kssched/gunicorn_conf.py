"""gunicorn settings: `gunicorn -c kssched/gunicorn_conf.py kssched.wsgi`.

Sync workers answer `Connection: close`, so kube-scheduler never reuses a connection
that gunicorn is about to close (a reused POST that fails is not retried by Go).
kube-scheduler sends one request at a time; a few workers leave room for probes,
the admin and worker restarts.
"""

import os

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

accesslog = "-" if os.environ.get("KSSCHED_ACCESS_LOG", "") == "1" else None
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "generic": {"format": "%(asctime)s %(levelname)s gunicorn: %(message)s"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stdout",
            "formatter": "generic",
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


def post_fork(server, worker):
    """Start each worker without database connections inherited from the master."""
    from django.conf import settings

    if settings.configured:
        from django.db import connections

        connections.close_all()
