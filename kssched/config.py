"""The settings that processes outside Django need too, read in one place.

`python -m kssched.serve`, the gunicorn config, its workers and `python -m
kssched.probe` start before (or without) Django; `kssched/settings.py` reads the same
values from here. Their defaults and what they allow are in kssched.variables.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kssched import variables

# Where kube-scheduler's calls go on both listeners (its `urlPrefix` ends here).
EXTENDER_PREFIX = "/scheduler/"
# Where the API server sends admission reviews (webhook mode).
WEBHOOK_PREFIX = "/webhook/"

# What kssched.serve sets for its gunicorns once it has emptied the metrics directory.
METRICS_DIR_READY = "KSSCHED_METRICS_DIR_READY"

# The variables this module reads (kssched.variables has their defaults and kinds).
NAMES = (
    "KSSCHED_LISTENER",
    "KSSCHED_BIND",
    "WEB_CONCURRENCY",
    "KSSCHED_WEB_READ_TIMEOUT",
    "KSSCHED_EXTENDER_BIND",
    "KSSCHED_EXTENDER_WORKERS",
    "KSSCHED_EXTENDER_READ_TIMEOUT",
    "KSSCHED_WORKER_TIMEOUT",
    "KSSCHED_GRACEFUL_TIMEOUT",
    "KSSCHED_KEEPALIVE",
    "KSSCHED_ACCESS_LOG",
    "KSSCHED_LOG_FORMAT",
    "KSSCHED_TLS_CERT_FILE",
    "KSSCHED_TLS_KEY_FILE",
    "KSSCHED_TLS_CA_FILE",
    "PROMETHEUS_MULTIPROC_DIR",
)


@dataclass(frozen=True)
class ServerConfig:
    listener: str
    bind: str
    web_workers: int
    web_read_timeout: float
    extender_bind: str
    extender_workers: int
    extender_read_timeout: float
    worker_timeout: int
    graceful_timeout: int
    keepalive: int
    access_log: bool
    log_format: str
    tls_cert_file: str
    tls_key_file: str
    tls_ca_file: str
    metrics_dir: str
    # Set by kssched.serve for its two gunicorns: it has emptied `metrics_dir`.
    metrics_dir_ready: bool

    @property
    def read_timeout(self) -> float:
        """The read timeout of this process's listener."""
        if self.listener == "extender":
            return self.extender_read_timeout
        return self.web_read_timeout


def load(environ: Mapping[str, str] | None = None) -> ServerConfig:
    """The settings from `environ` (the process environment by default); a
    kssched.variables.SettingError (a ValueError) names a setting whose value is not
    valid."""
    source = os.environ if environ is None else environ
    config = from_parsed(variables.read(source, names=NAMES))
    return replace(config, metrics_dir_ready=source.get(METRICS_DIR_READY) == "1")


def from_parsed(parsed: Mapping[str, Any]) -> ServerConfig:
    """The ServerConfig of values kssched.variables has parsed."""
    return ServerConfig(
        listener=parsed["KSSCHED_LISTENER"],
        bind=parsed["KSSCHED_BIND"],
        web_workers=parsed["WEB_CONCURRENCY"],
        web_read_timeout=parsed["KSSCHED_WEB_READ_TIMEOUT"],
        extender_bind=parsed["KSSCHED_EXTENDER_BIND"],
        extender_workers=parsed["KSSCHED_EXTENDER_WORKERS"],
        extender_read_timeout=parsed["KSSCHED_EXTENDER_READ_TIMEOUT"],
        worker_timeout=parsed["KSSCHED_WORKER_TIMEOUT"],
        graceful_timeout=parsed["KSSCHED_GRACEFUL_TIMEOUT"],
        keepalive=parsed["KSSCHED_KEEPALIVE"],
        access_log=parsed["KSSCHED_ACCESS_LOG"],
        log_format=parsed["KSSCHED_LOG_FORMAT"],
        tls_cert_file=parsed["KSSCHED_TLS_CERT_FILE"],
        tls_key_file=parsed["KSSCHED_TLS_KEY_FILE"],
        tls_ca_file=parsed["KSSCHED_TLS_CA_FILE"],
        metrics_dir=parsed["PROMETHEUS_MULTIPROC_DIR"],
        metrics_dir_ready=False,
    )
