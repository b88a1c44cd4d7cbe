"""The settings that processes outside Django need too, read in one place.

`python -m kssched.serve`, the gunicorn config, its workers and `python -m
kssched.probe` start before (or without) Django; `kssched/settings.py` reads the same
values from here. `DEFAULTS` is the one place their defaults are written; the
README's settings table is checked against it (tests/test_config.py).
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass

# Where kube-scheduler's calls go on both listeners (its `urlPrefix` ends here).
EXTENDER_PREFIX = "/scheduler/"

# What kssched.serve sets for its gunicorns once it has emptied the metrics directory.
METRICS_DIR_READY = "KSSCHED_METRICS_DIR_READY"

DEFAULTS: dict[str, str] = {
    "KSSCHED_LISTENER": "web",
    "KSSCHED_BIND": "0.0.0.0:8080",
    "WEB_CONCURRENCY": "3",
    "KSSCHED_WEB_READ_TIMEOUT": "10",
    "KSSCHED_EXTENDER_BIND": "127.0.0.1:8081",
    "KSSCHED_EXTENDER_WORKERS": "2",
    "KSSCHED_EXTENDER_READ_TIMEOUT": "2",
    "KSSCHED_WORKER_TIMEOUT": "20",
    "KSSCHED_GRACEFUL_TIMEOUT": "20",
    "KSSCHED_ACCESS_LOG": "0",
    "KSSCHED_LOG_FORMAT": "text",
    "KSSCHED_TLS_CERT_FILE": "",
    "KSSCHED_TLS_KEY_FILE": "",
    "KSSCHED_TLS_CA_FILE": "",
    "PROMETHEUS_MULTIPROC_DIR": "",
}


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
    ValueError names a setting whose value is not valid."""
    source = os.environ if environ is None else environ

    def raw(name: str) -> str:
        return source.get(name, DEFAULTS[name])

    def number(name: str, kind):
        try:
            value = kind(raw(name))
        except ValueError:
            raise ValueError(f"{name} must be a number, not {raw(name)!r}") from None
        if value <= 0:
            raise ValueError(f"{name} must be above 0, not {raw(name)!r}")
        return value

    listener = raw("KSSCHED_LISTENER")
    if listener not in ("web", "extender"):
        raise ValueError(
            f"KSSCHED_LISTENER must be 'web' or 'extender', not {listener!r}"
        )
    log_format = raw("KSSCHED_LOG_FORMAT").lower()
    if log_format not in ("text", "json"):
        raise ValueError(
            f"KSSCHED_LOG_FORMAT must be 'text' or 'json', not {log_format!r}."
        )
    config = ServerConfig(
        listener=listener,
        bind=raw("KSSCHED_BIND"),
        web_workers=number("WEB_CONCURRENCY", int),
        web_read_timeout=number("KSSCHED_WEB_READ_TIMEOUT", float),
        extender_bind=raw("KSSCHED_EXTENDER_BIND"),
        extender_workers=number("KSSCHED_EXTENDER_WORKERS", int),
        extender_read_timeout=number("KSSCHED_EXTENDER_READ_TIMEOUT", float),
        worker_timeout=number("KSSCHED_WORKER_TIMEOUT", int),
        graceful_timeout=number("KSSCHED_GRACEFUL_TIMEOUT", int),
        access_log=raw("KSSCHED_ACCESS_LOG") == "1",
        log_format=log_format,
        tls_cert_file=raw("KSSCHED_TLS_CERT_FILE"),
        tls_key_file=raw("KSSCHED_TLS_KEY_FILE"),
        tls_ca_file=raw("KSSCHED_TLS_CA_FILE"),
        metrics_dir=raw("PROMETHEUS_MULTIPROC_DIR"),
        metrics_dir_ready=source.get(METRICS_DIR_READY) == "1",
    )
    if (config.tls_key_file or config.tls_ca_file) and not config.tls_cert_file:
        raise ValueError(
            "KSSCHED_TLS_KEY_FILE and KSSCHED_TLS_CA_FILE need KSSCHED_TLS_CERT_FILE"
        )
    return config
