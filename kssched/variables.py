"""Every environment variable of ks-scheduler: its default, what it allows, and how
it is read. The one place the environment is parsed.

`read()` parses all of them at once, so a bad value stops a process at start-up (the
gunicorn master before it forks, `kssched.serve`, every `manage.py` command) with one
line naming the variable, its value and what is allowed, instead of a Ready pod that
fails every call. `kssched/settings.py` and `kssched.config` take their values from
here; docs/settings.md lists the same `allowed` texts (tests/test_config.py). The
kinds of value are in kssched.valuekinds.

No Django here: the processes outside Django import this module too.
"""

import difflib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kssched.valuekinds import (
    Bind,
    Choice,
    DatabaseUrl,
    Flag,
    LabelKey,
    Number,
    OrAuto,
    SettingError,
    Text,
    TextList,
    bind_parts,
    is_loopback_bind,
)

__all__ = ["SettingError", "bind_parts", "check", "read", "unknown"]

# What `manage.py` and the servers print before a SettingError's text.
PREFIX = "ks-scheduler: "
DOT_ENV = Path(__file__).resolve().parent.parent / ".env"

# Variables that only the tests and tools read: known, so never warned about.
TOOL_VARIABLES = frozenset(
    {
        "KSSCHED_CHROMIUM",
        "KSSCHED_SCREENSHOT_DIR",
        "KSSCHED_TEST_POOLER",
        # Set by kssched.serve for its gunicorns (kssched.config.METRICS_DIR_READY).
        "KSSCHED_METRICS_DIR_READY",
    }
)


@dataclass(frozen=True)
class Variable:
    name: str
    # The value when unset; None: unset reads as None (settings.py decides).
    default: str | None
    kind: Any

    def read(self, source: Mapping[str, str]) -> Any:
        text = source.get(self.name)
        if text is None:
            if self.default is None:
                return None
            text = self.default
        try:
            return self.kind.parse(text.strip())
        except ValueError:
            raise SettingError(self.name, text, self.kind.allowed) from None


def _seconds(example: str, *, above: bool = True) -> Number:
    return Number("a number of seconds", example, above=above)


def _count(example: str, *, minimum: int = 1, what: str = "a whole number") -> Number:
    return Number(what, example, minimum=minimum, above=False, whole=True)


def _days(example: str, *, above: bool = True) -> Number:
    return Number("a number of days", example, above=above)


# The scoring strategies' names (extender.scoring.strategies.STRATEGIES; a test holds
# the two together).
SCORING_NAMES = ("warm", "seed")
_METRICS_BIND = Bind(
    "HOST:PORT with an IP address or host name and a port 1-65535 (e.g. "
    "0.0.0.0:9100 or 127.0.0.1:9100), or empty (off)",
    unix=False,
    optional=True,
)

VARIABLES: tuple[Variable, ...] = (
    # Core
    Variable("KSSCHED_READ_DOT_ENV", "0", Flag()),
    Variable("DEBUG", "false", Flag()),
    Variable("SECRET_KEY", None, Text("a long random string (required)")),
    Variable("ALLOWED_HOSTS", "", TextList("comma-separated host names")),
    Variable("CSRF_TRUSTED_ORIGINS", "", TextList("comma-separated origins")),
    Variable("VERSION", None, Text()),
    # Database
    Variable("DATABASE_URL", "", DatabaseUrl()),
    Variable("DATA_PATH", "", Text("a file path")),
    Variable("KSSCHED_TEST_DATABASE", "", Text("a file path")),
    Variable("KSSCHED_SQLITE_TIMEOUT", "5", _seconds("5")),
    Variable("KSSCHED_ADMIN_WRITE_WAIT", "10", _seconds("10")),
    Variable(
        "CONN_MAX_AGE", None, _count("600", minimum=0, what="a whole number of seconds")
    ),
    Variable("KSSCHED_PG_TRANSACTION_POOLER", "false", Flag()),
    Variable("KSSCHED_STATIC_ROOT", "", Text("a directory path")),
    # Security
    Variable("KSSCHED_HTTPS", "false", Flag()),
    Variable(
        "SECURE_HSTS_SECONDS",
        "31536000",
        _count("31536000", minimum=0, what="a whole number of seconds"),
    ),
    Variable("SECURE_HSTS_PRELOAD", "false", Flag()),
    Variable("SECURE_SSL_REDIRECT", None, Flag()),
    Variable("KSSCHED_BEHIND_PROXY", "false", Flag()),
    Variable(
        "KSSCHED_SILENCED_CHECKS",
        "security.W021",
        TextList("comma-separated check ids"),
    ),
    Variable("KSSCHED_METRICS_TOKEN", "", Text()),
    Variable("KSSCHED_LOGIN_FAILURE_LIMIT", "5", _count("5")),
    Variable(
        "KSSCHED_LOGIN_COOLOFF_MINUTES", "15", Number("a number of minutes", "15")
    ),
    # Scoring
    Variable("KSSCHED_PIPELINE_LABEL", "ks-pipeline", LabelKey()),
    Variable(
        "KSSCHED_SCHEDULER_NAME",
        "ks-scheduler",
        Text("a scheduler name (not empty)", required=True),
    ),
    Variable("KSSCHED_SCORING", "warm", Choice(SCORING_NAMES)),
    Variable("KSSCHED_HALF_LIFE_DAYS", "7", _days("7")),
    # At most history.reader.depths.DEEPEST (a test holds the two together).
    Variable(
        "KSSCHED_WORKSPACE_DEPTH",
        "0",
        OrAuto(
            Number(
                "a whole number of pipelines", "4", above=False, whole=True, maximum=16
            )
        ),
    ),
    Variable("KSSCHED_WORTH", "auto", Choice(("auto", "off"))),
    Variable("KSSCHED_WORTH_REFRESH_SECONDS", "60", _seconds("60")),
    Variable("KSSCHED_WORTH_DAYS", "30", _days("30")),
    Variable("KSSCHED_HISTORY_CACHE", "true", Flag()),
    Variable("KSSCHED_HISTORY_CACHE_MB", "256", Number("a number of MiB", "256")),
    Variable(
        "KSSCHED_WARM_START_SECONDS",
        "8",
        Number("a number of seconds", "8", above=False),
    ),
    Variable("KSSCHED_NODE_RETENTION_DAYS", "90", _days("90", above=False)),
    Variable(
        "KSSCHED_LEDGER_RETENTION_DAYS",
        "90",
        Number("a whole number of days", "90", above=False, whole=True, maximum=36500),
    ),
    Variable(
        "KSSCHED_MAX_BODY_BYTES",
        "16777216",
        _count("16777216", what="a whole number of bytes"),
    ),
    # Webhook
    Variable("KSSCHED_WEBHOOK_MAX_NODES", "20", _count("20")),
    Variable("KSSCHED_WEBHOOK_MEMORY_SECONDS", "15", _seconds("15", above=False)),
    Variable(
        "KSSCHED_WEBHOOK_SKIP_NAMESPACES",
        "kube-system",
        TextList("comma-separated namespace names"),
    ),
    Variable("KSSCHED_WEBHOOK_POOL_DAYS", "7", _days("7")),
    # Watcher
    Variable(
        "KSSCHED_HEARTBEAT_PATH",
        "/tmp/ks-watcher/heartbeat",
        Text("a file path", required=True),
    ),
    Variable("KSSCHED_WATCHER_METRICS_BIND", "127.0.0.1:9100", _METRICS_BIND),
    Variable("KSSCHED_WATCH_CONNECT_TIMEOUT", "10", _seconds("10")),
    Variable("KSSCHED_WATCH_READ_TIMEOUT", "120", _seconds("120")),
    Variable(
        "KSSCHED_WATCH_TIMEOUT_MIN",
        "300",
        _count("300", what="a whole number of seconds"),
    ),
    Variable(
        "KSSCHED_WATCH_TIMEOUT_MAX",
        "600",
        _count("600", what="a whole number of seconds"),
    ),
    Variable("KSSCHED_WATCH_BACKOFF_BASE", "0.8", _seconds("0.8")),
    Variable("KSSCHED_WATCH_BACKOFF_CAP", "30", _seconds("30")),
    Variable("KSSCHED_WATCH_BACKOFF_RESET", "120", _seconds("120")),
    Variable("KSSCHED_WATCH_LIST_PAGE", "500", _count("500")),
    Variable("KSSCHED_WATCH_NODES", "true", Flag()),
    Variable("KSSCHED_WATCH_ANY_SCHEDULER", "false", Flag()),
    Variable("KSSCHED_PLACEMENT_EVENTS", "true", Flag()),
    Variable(
        "KSSCHED_PLACEMENT_EVENTS_PER_SECOND",
        "5",
        Number("a number of Events a second", "5"),
    ),
    Variable("KSSCHED_PLACEMENT_EVENTS_BURST", "20", _count("20")),
    Variable(
        "KSSCHED_LEASE_NAME",
        "ks-scheduler-watcher",
        Text("a Lease name (not empty)", required=True),
    ),
    Variable("KSSCHED_LEASE_DURATION", "15", _seconds("15")),
    Variable("KSSCHED_LEASE_RENEW_DEADLINE", "10", _seconds("10")),
    Variable("KSSCHED_LEASE_RETRY_PERIOD", "2", _seconds("2")),
    Variable("POD_NAME", "", Text()),
    Variable("POD_NAMESPACE", "", Text()),
    # Logging
    Variable(
        "LOG_LEVEL",
        "INFO",
        Choice(("debug", "info", "warning", "error", "critical"), ignore_case=True),
    ),
    Variable("KSSCHED_LOG_FORMAT", "text", Choice(("text", "json"), ignore_case=True)),
    # Serving (kssched.config)
    Variable("KSSCHED_LISTENER", "web", Choice(("web", "extender"))),
    Variable("KSSCHED_BIND", "0.0.0.0:8080", Bind()),
    Variable("WEB_CONCURRENCY", "3", _count("3")),
    Variable("KSSCHED_WEB_READ_TIMEOUT", "10", _seconds("10")),
    Variable("KSSCHED_EXTENDER_BIND", "127.0.0.1:8081", Bind()),
    Variable("KSSCHED_EXTENDER_WORKERS", "2", _count("2")),
    Variable("KSSCHED_EXTENDER_READ_TIMEOUT", "2", _seconds("2")),
    Variable(
        "KSSCHED_WORKER_TIMEOUT", "20", _count("20", what="a whole number of seconds")
    ),
    Variable(
        "KSSCHED_GRACEFUL_TIMEOUT", "20", _count("20", what="a whole number of seconds")
    ),
    Variable(
        "KSSCHED_KEEPALIVE",
        "100",
        _count("100", minimum=0, what="a whole number of seconds"),
    ),
    Variable("KSSCHED_ACCESS_LOG", "0", Flag()),
    Variable("KSSCHED_TLS_CERT_FILE", "", Text("a file path")),
    Variable("KSSCHED_TLS_KEY_FILE", "", Text("a file path")),
    Variable("KSSCHED_TLS_CA_FILE", "", Text("a file path")),
    Variable("PROMETHEUS_MULTIPROC_DIR", "", Text("a directory path")),
)
BY_NAME = {variable.name: variable for variable in VARIABLES}

# Replaced variables: still read, with a warning naming the new one.
DEPRECATED = {
    "KSSCHED_WATCHER_METRICS_PORT": "use KSSCHED_WATCHER_METRICS_BIND=HOST:PORT",
}
_LEGACY_PORT = Number("a port number", "9100", above=False, whole=True, maximum=65535)


def _legacy_metrics_port(values: dict[str, str]) -> None:
    """KSSCHED_WATCHER_METRICS_PORT=N (before KSSCHED_WATCHER_METRICS_BIND) served on
    every address: N>0 reads as 0.0.0.0:N, 0 as off (a `.env` written by an older
    `make` has 0)."""
    port = values.get("KSSCHED_WATCHER_METRICS_PORT")
    if port is None or "KSSCHED_WATCHER_METRICS_BIND" in values:
        return
    try:
        number = _LEGACY_PORT.parse(port.strip())
    except ValueError:
        raise SettingError(
            "KSSCHED_WATCHER_METRICS_PORT", port, _LEGACY_PORT.allowed
        ) from None
    values["KSSCHED_WATCHER_METRICS_BIND"] = f"0.0.0.0:{number}" if number else ""


def source(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables `environ` (the process environment by default) sets, with the
    checkout's `.env` under them when KSSCHED_READ_DOT_ENV is on (real environment
    variables win, as in kssched/settings.py)."""
    values = dict(os.environ if environ is None else environ)
    if BY_NAME["KSSCHED_READ_DOT_ENV"].read(values) and DOT_ENV.is_file():
        for line in DOT_ENV.read_text().splitlines():
            name, sep, value = line.strip().partition("=")
            if sep and not name.startswith("#"):
                values.setdefault(name.strip(), value.strip().strip("'\""))
    _legacy_metrics_port(values)
    return values


def read(
    environ: Mapping[str, str] | None = None, *, names: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """The parsed value of every variable (or of `names`), from `source(environ)`; a
    SettingError names the first variable whose value is not valid."""
    values = source(environ)
    chosen = VARIABLES if names is None else [BY_NAME[name] for name in names]
    parsed = {variable.name: variable.read(values) for variable in chosen}
    for needs, check in _CHECKS:
        if needs <= parsed.keys():
            check(parsed, values)
    return parsed


def _secret_key(parsed: dict[str, Any], values: Mapping[str, str]) -> None:
    if not parsed["SECRET_KEY"] and not parsed["DEBUG"]:
        raise SettingError(
            "SECRET_KEY",
            values.get("SECRET_KEY", ""),
            "required: a long random string (in a checkout, `make run` writes one to "
            ".env, which `.venv/bin/python manage.py` reads)",
        )


def _watch_timeouts(parsed: dict[str, Any], values: Mapping[str, str]) -> None:
    shortest, longest = (
        parsed["KSSCHED_WATCH_TIMEOUT_MIN"],
        parsed["KSSCHED_WATCH_TIMEOUT_MAX"],
    )
    if longest <= shortest:
        raise SettingError(
            "KSSCHED_WATCH_TIMEOUT_MAX",
            str(longest),
            f"a whole number of seconds above KSSCHED_WATCH_TIMEOUT_MIN ({shortest})",
        )


def _tls(parsed: dict[str, Any], values: Mapping[str, str]) -> None:
    for name in ("KSSCHED_TLS_KEY_FILE", "KSSCHED_TLS_CA_FILE"):
        if parsed[name] and not parsed["KSSCHED_TLS_CERT_FILE"]:
            raise SettingError(name, values[name], "only with KSSCHED_TLS_CERT_FILE")


def _extender_on_loopback(parsed: dict[str, Any], values: Mapping[str, str]) -> None:
    """Only kube-scheduler in the same pod may reach the extender listener, unless
    gunicorn verifies client certificates."""
    address = parsed["KSSCHED_EXTENDER_BIND"]
    if not parsed["KSSCHED_TLS_CA_FILE"] and not is_loopback_bind(address):
        raise SettingError(
            "KSSCHED_EXTENDER_BIND",
            address,
            "a loopback address (e.g. 127.0.0.1:8081): the extender listener is "
            "for kube-scheduler in the same pod, or needs TLS with client "
            "certificates (KSSCHED_TLS_CA_FILE)",
        )


# Rules over more than one variable, with the variables each needs.
_CHECKS: tuple[
    tuple[frozenset[str], Callable[[dict[str, Any], Mapping[str, str]], None]], ...
] = (
    (frozenset({"SECRET_KEY", "DEBUG"}), _secret_key),
    (
        frozenset({"KSSCHED_WATCH_TIMEOUT_MIN", "KSSCHED_WATCH_TIMEOUT_MAX"}),
        _watch_timeouts,
    ),
    (
        frozenset(
            {"KSSCHED_TLS_CERT_FILE", "KSSCHED_TLS_KEY_FILE", "KSSCHED_TLS_CA_FILE"}
        ),
        _tls,
    ),
    (
        frozenset({"KSSCHED_EXTENDER_BIND", "KSSCHED_TLS_CA_FILE"}),
        _extender_on_loopback,
    ),
)


def unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """A warning for each KSSCHED_* variable that is set but is no setting, with
    the nearest setting's name when one is close, and for each deprecated one."""
    known = set(BY_NAME) | TOOL_VARIABLES
    warnings = []
    for name in sorted(source(environ)):
        if name in DEPRECATED:
            warnings.append(f"{name} is deprecated: {DEPRECATED[name]}")
        elif name.startswith("KSSCHED_") and name not in known:
            # Compared without the shared prefix, which would make every name close.
            near = difflib.get_close_matches(
                name.removeprefix("KSSCHED_"),
                sorted(k[8:] for k in known if k.startswith("KSSCHED_")),
                n=1,
                cutoff=0.7,
            )
            hint = f" (did you mean KSSCHED_{near[0]}?)" if near else ""
            warnings.append(f"{name} is not a setting and is ignored{hint}")
    return warnings


def check(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every variable parsed, for a process's start: a bad value prints one line to
    stderr and exits with status 1; unknown KSSCHED_* variables are warned about."""
    try:
        parsed = read(environ)
    except SettingError as exc:
        raise SystemExit(PREFIX + str(exc)) from None
    for warning in unknown(environ):
        print(f"{PREFIX}warning: {warning}", file=sys.stderr, flush=True)
    return parsed
