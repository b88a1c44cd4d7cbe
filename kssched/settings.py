"""Settings for ks-scheduler, from the environment as kssched.variables parses it.

Every variable is listed in the settings table (docs/settings.md) with what it
allows; a bad value raises kssched.variables.SettingError, which `manage.py` and the
servers show as one line. Real environment variables always win; a `.env` file is
read only when KSSCHED_READ_DOT_ENV=1. In a checkout, `make run` writes that file and
`manage.py` turns the switch on when it finds it; the image has no `.env`.
"""

from datetime import timedelta
from pathlib import Path

import django_stubs_ext
import environ

from kssched import __version__, config, variables

# Django's generic classes (admin.ModelAdmin[KeyNode]) subscriptable at runtime, as
# django-stubs types them (`mypy --strict`).
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

# Every variable, parsed at once (a SettingError names a bad one).
ENV = variables.read()

# --- Core -----------------------------------------------------------------------------

DEBUG = ENV["DEBUG"]
# No production default: a missing SECRET_KEY fails at start-up unless DEBUG is on
# (kssched.variables).
SECRET_KEY = ENV["SECRET_KEY"] or "insecure-dev-only-key"

# kube-scheduler in the same pod calls the extender as localhost or 127.0.0.1.
ALLOWED_HOSTS = [
    *ENV["ALLOWED_HOSTS"],
    "localhost",
    "127.0.0.1",
    "[::1]",
]
CSRF_TRUSTED_ORIGINS = ENV["CSRF_TRUSTED_ORIGINS"]

KSSCHED_VERSION = ENV["VERSION"] or __version__

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "axes",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "history",
    "extender",
]

MIDDLEWARE = [
    # First: refuses non-loopback extender callers before any other work, and
    # times the extender requests for /metrics.
    "kssched.middleware.ExtenderMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Sessions, users and messages are skipped on the extender routes (see the
    # module); CSRF and frame options stay Django's own for `check --deploy`.
    "kssched.sitemiddleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "kssched.sitemiddleware.AuthenticationMiddleware",
    "kssched.sitemiddleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: turns a locked-out login into its 429 page. On
    # every other request it only looks for a flag that a login attempt sets.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "kssched.urls"
WSGI_APPLICATION = "kssched.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------
# SQLite file at DATA_PATH unless DATABASE_URL is set. The web workers and the watcher
# share the file: WAL lets readers go on while the watcher writes, and IMMEDIATE
# transactions wait for the write lock (up to the busy timeout) instead of failing at
# once with "database is locked".

# The default is the image's volume. Only a configured DATA_PATH has its folder
# created: an unconfigured checkout must not create /data.
DEFAULT_DATA_PATH = "/data/scheduler.db"
DATA_PATH_IS_SET = bool(ENV["DATA_PATH"])
DATA_PATH = Path(ENV["DATA_PATH"] or DEFAULT_DATA_PATH)
SQLITE_TIMEOUT = ENV["KSSCHED_SQLITE_TIMEOUT"]
# An admin edit keeps trying for the SQLite write lock this long in all, then tells
# the user nothing was changed. Keep it below gunicorn's KSSCHED_WORKER_TIMEOUT.
KSSCHED_ADMIN_WRITE_WAIT = ENV["KSSCHED_ADMIN_WRITE_WAIT"]

if ENV["DATABASE_URL"]:
    DATABASES = {"default": environ.Env.db_url_config(ENV["DATABASE_URL"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_PATH),
        }
    }

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATA_PATH = Path(DATABASES["default"]["NAME"])
    if DATA_PATH_IS_SET or ENV["DATABASE_URL"]:
        DATA_PATH.parent.mkdir(parents=True, exist_ok=True)
    elif not DATA_PATH.parent.is_dir():
        raise variables.SettingError(
            "DATA_PATH",
            "",
            f"required when {DATA_PATH.parent} does not exist: the SQLite file's "
            "path (in a checkout, `make run` writes it to .env)",
        )
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": SQLITE_TIMEOUT,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["TEST"] = {
        "NAME": ENV["KSSCHED_TEST_DATABASE"] or str(DATA_PATH.parent / "test.db")
    }
    # Opening a connection and running the PRAGMAs costs about 0.5 ms, as much as
    # a whole prioritize call for 100 nodes: each worker keeps its connection.
    DATABASES["default"]["CONN_MAX_AGE"] = (
        600 if ENV["CONN_MAX_AGE"] is None else ENV["CONN_MAX_AGE"]
    )
else:
    # Reuse connections between requests; the watcher closes stale ones itself.
    DATABASES["default"].setdefault(
        "CONN_MAX_AGE", 60 if ENV["CONN_MAX_AGE"] is None else ENV["CONN_MAX_AGE"]
    )
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
    # Behind a pooler in transaction mode (PgBouncer's pool_mode=transaction), each
    # statement outside a transaction may run on another server session, so the
    # server-side cursor QuerySet.iterator() declares in one statement and reads in
    # the next is not there ("portal ... does not exist"). True: read those rows with
    # ordinary cursors instead.
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = ENV[
        "KSSCHED_PG_TRANSACTION_POOLER"
    ]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Static files (served by whitenoise, so plain gunicorn serves the admin) ---------

STATIC_URL = "static/"
STATIC_ROOT = Path(ENV["KSSCHED_STATIC_ROOT"] or BASE_DIR / "staticfiles")
# Files served at the site's root: /favicon.ico, which browsers ask for on every page.
WHITENOISE_ROOT = BASE_DIR / "kssched" / "root"
# Without collected files (a fresh checkout) whitenoise serves from the apps directly.
WHITENOISE_USE_FINDERS = not STATIC_ROOT.is_dir()
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"
        if STATIC_ROOT.is_dir()
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

# --- Security -------------------------------------------------------------------------
# Secure cookies and HSTS apply when the admin is served over HTTPS (set
# KSSCHED_HTTPS=1 behind TLS). The extender is called over plain HTTP on loopback.

KSSCHED_HTTPS = ENV["KSSCHED_HTTPS"]
SESSION_COOKIE_SECURE = KSSCHED_HTTPS
CSRF_COOKIE_SECURE = KSSCHED_HTTPS
SECURE_HSTS_SECONDS = ENV["SECURE_HSTS_SECONDS"] if KSSCHED_HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = KSSCHED_HTTPS
SECURE_HSTS_PRELOAD = ENV["SECURE_HSTS_PRELOAD"]
SECURE_SSL_REDIRECT = (
    KSSCHED_HTTPS if ENV["SECURE_SSL_REDIRECT"] is None else ENV["SECURE_SSL_REDIRECT"]
)
# kube-scheduler and the kubelet probes speak plain HTTP: never redirect them.
SECURE_REDIRECT_EXEMPT = [
    r"^scheduler/",
    r"^version$",
    r"^healthz$",
    r"^readyz$",
    r"^metrics$",
]
if ENV["KSSCHED_BEHIND_PROXY"]:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
# HSTS preloading commits a whole domain to HTTPS for months; that is the domain
# owner's decision (SECURE_HSTS_PRELOAD=1), so its reminder is silenced by default.
SILENCED_SYSTEM_CHECKS = ENV["KSSCHED_SILENCED_CHECKS"]

# TLS served by gunicorn itself (read by kssched/gunicorn_conf.py too). With a CA,
# gunicorn requires client certificates signed by it, and the extender routes then
# also answer callers outside the pod (kube-scheduler's enableHTTPS + tlsConfig).
# The settings the processes outside Django read too come from kssched.config.
KSSCHED_SERVER = config.from_parsed(ENV)
KSSCHED_TLS_CERT_FILE = KSSCHED_SERVER.tls_cert_file
KSSCHED_TLS_KEY_FILE = KSSCHED_SERVER.tls_key_file
KSSCHED_TLS_CA_FILE = KSSCHED_SERVER.tls_ca_file
# /metrics is open (the NetworkPolicy limits who reaches port 8080); with a token
# set, scrapes need `Authorization: Bearer <token>`.
KSSCHED_METRICS_TOKEN = ENV["KSSCHED_METRICS_TOKEN"]

# Login throttling (django-axes): after KSSCHED_LOGIN_FAILURE_LIMIT failed logins for
# one username from one client address, that pair is refused, even with the right
# password, for KSSCHED_LOGIN_COOLOFF_MINUTES. Unlock earlier with
# `manage.py axes_reset_username USER` (see docs/operate.md). Axes's backend comes first
# so a locked-out pair never reaches the password check.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = ENV["KSSCHED_LOGIN_FAILURE_LIMIT"]
AXES_COOLOFF_TIME = timedelta(minutes=ENV["KSSCHED_LOGIN_COOLOFF_MINUTES"])
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# The cool-off runs from the lockout: more attempts during it do not extend it.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
# A successful login forgets the earlier failures of that username and address.
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "admin/login_locked.html"
# No start-up banner: management commands print their own output to stdout.
AXES_VERBOSE = False

_VALIDATORS = "django.contrib.auth.password_validation"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": f"{_VALIDATORS}.UserAttributeSimilarityValidator"},
    {"NAME": f"{_VALIDATORS}.MinimumLengthValidator"},
    {"NAME": f"{_VALIDATORS}.CommonPasswordValidator"},
    {"NAME": f"{_VALIDATORS}.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
# ISO-like dates in the admin (kssched/formats/).
FORMAT_MODULE_PATH = ["kssched.formats"]

# --- Django REST framework ------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["extender.renderers.ORJSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["extender.parsers.ORJSONParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "extender.views.extender_exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

# OpenAPI schema of the history API at /api/schema/. The extender routes speak
# kube-scheduler's protocol and are left out.
SPECTACULAR_SETTINGS = {
    "TITLE": "ks-scheduler history API",
    "DESCRIPTION": "Read-only pipeline history: keys, counts per node, placements.",
    "VERSION": KSSCHED_VERSION,
    "SERVE_INCLUDE_SCHEMA": False,
    "PREPROCESSING_HOOKS": ["history.api.only_api_paths"],
}

# --- ks-scheduler ---------------------------------------------------------------------

KSSCHED_PIPELINE_LABEL = ENV["KSSCHED_PIPELINE_LABEL"]
KSSCHED_SCHEDULER_NAME = ENV["KSSCHED_SCHEDULER_NAME"]
KSSCHED_SCORING = ENV["KSSCHED_SCORING"]
# `warm` scoring: each placement's weight halves every half-life.
KSSCHED_HALF_LIFE_DAYS = ENV["KSSCHED_HALF_LIFE_DAYS"]
# `warm`: other pipelines placed on a node since a pipeline last was, from which its
# own workspace counts as gone there (docs/scoring.md); 0: off; "auto": the depth the
# watcher measures from the outcomes (`history.depth_feed`).
KSSCHED_WORKSPACE_DEPTH: int | str = ENV["KSSCHED_WORKSPACE_DEPTH"]
# `warm` scales each pipeline's warm pull by what warmth measurably saves it
# (history.worth), learned from the outcomes of the last KSSCHED_WORTH_DAYS and
# refreshed every KSSCHED_WORTH_REFRESH_SECONDS after a reply; "off": every
# pipeline gets today's pull (weight 1).
KSSCHED_WORTH = ENV["KSSCHED_WORTH"]
KSSCHED_WORTH_REFRESH_SECONDS = ENV["KSSCHED_WORTH_REFRESH_SECONDS"]
KSSCHED_WORTH_DAYS = ENV["KSSCHED_WORTH_DAYS"]
# Each web worker keeps an exact copy of the history it scores with (SQLite: synced
# from the ledger; PostgreSQL: from a trigger-written change log). Off: one
# statement per call, straight from the database.
KSSCHED_HISTORY_CACHE = ENV["KSSCHED_HISTORY_CACHE"]
# The most each worker's history cache holds, in MiB (estimated): rows of the keys
# asked about and the scores derived from them, least recently used keys dropped
# first. One KeyNode row is about 200 bytes (history.reader.cache).
KSSCHED_HISTORY_CACHE_MB = ENV["KSSCHED_HISTORY_CACHE_MB"]
# Before it serves, each web worker scores the labels of the recent placements for
# at most this long (and at most half KSSCHED_WORKER_TIMEOUT), so that its first
# calls find the shared label-path prefixes read (extender.warmup); 0: off.
KSSCHED_WARM_START_SECONDS = ENV["KSSCHED_WARM_START_SECONDS"]
# The rows of a node out of the pipeline pool this long are removed (prune_nodes,
# run by the watcher once a day; 0 turns that off).
KSSCHED_NODE_RETENTION_DAYS = ENV["KSSCHED_NODE_RETENTION_DAYS"]
# Ledger rows of pods that ended longer ago than this are pruned by the watcher once
# a day (prune_placements: counts do not change); 0 keeps the ledger forever.
KSSCHED_LEDGER_RETENTION_DAYS = ENV["KSSCHED_LEDGER_RETENTION_DAYS"]
# Full Node lists are large (1000 nodes are about 14 MB); only the extender routes
# accept bodies this big, the rest of the site keeps Django's default limit. A body
# may decode to at most 8 times this (extender.parsers): the deployment's memory
# limit is sized for it (docs/operate.md, "Limits").
KSSCHED_MAX_BODY_BYTES: int = ENV["KSSCHED_MAX_BODY_BYTES"]
# Which listener this process serves (set by `python -m kssched.serve`): "web" (the
# pod port) or "extender" (loopback, the /scheduler/ routes, /healthz and /version
# only).
KSSCHED_LISTENER = KSSCHED_SERVER.listener
KSSCHED_EXTENDER_BIND = KSSCHED_SERVER.extender_bind

# --- Webhook mode (POST /webhook/mutate) ----------------------------------------------
# At most this many warm nodes are named in the preferred node affinity of one pod.
KSSCHED_WEBHOOK_MAX_NODES = ENV["KSSCHED_WEBHOOK_MAX_NODES"]
# The longest the webhook counts a pod it steered to a node before the watcher
# records it bound (from then on the ledger counts it, until it finishes): enough
# for a pod to be scheduled and recorded, short enough that reviews whose pods never
# appear stop counting within seconds.
KSSCHED_WEBHOOK_MEMORY_SECONDS = ENV["KSSCHED_WEBHOOK_MEMORY_SECONDS"]
# Namespaces whose pods the webhook never patches, whatever the namespaceSelector
# lets through (before Kubernetes 1.21 namespaces lack the kubernetes.io/metadata.name
# label the shipped selector excludes kube-system by).
KSSCHED_WEBHOOK_SKIP_NAMESPACES = frozenset(ENV["KSSCHED_WEBHOOK_SKIP_NAMESPACES"])
# The pipeline pool: nodes that ran a pipeline pod, or that the watcher first saw, in
# this many days. The load rule compares a node with the pool's mean load (prioritize
# compares it with kube-scheduler's candidates).
KSSCHED_WEBHOOK_POOL_DAYS = ENV["KSSCHED_WEBHOOK_POOL_DAYS"]

# --- Watcher (manage.py watch_pods) -------------------------------------------------
# Timeouts bound every call to the API server; tests shrink them to seconds.

KSSCHED_HEARTBEAT_PATH = ENV["KSSCHED_HEARTBEAT_PATH"]
# HOST:PORT of the watcher's metrics listener; empty: off.
KSSCHED_WATCHER_METRICS_BIND = ENV["KSSCHED_WATCHER_METRICS_BIND"]
KSSCHED_WATCH_CONNECT_TIMEOUT = ENV["KSSCHED_WATCH_CONNECT_TIMEOUT"]
KSSCHED_WATCH_READ_TIMEOUT = ENV["KSSCHED_WATCH_READ_TIMEOUT"]
# The server ends each watch after a random time in [MIN, MAX) seconds.
KSSCHED_WATCH_SERVER_TIMEOUT_MIN = ENV["KSSCHED_WATCH_TIMEOUT_MIN"]
KSSCHED_WATCH_SERVER_TIMEOUT_MAX = ENV["KSSCHED_WATCH_TIMEOUT_MAX"]
KSSCHED_WATCH_BACKOFF_BASE = ENV["KSSCHED_WATCH_BACKOFF_BASE"]
KSSCHED_WATCH_BACKOFF_CAP = ENV["KSSCHED_WATCH_BACKOFF_CAP"]
KSSCHED_WATCH_BACKOFF_RESET = ENV["KSSCHED_WATCH_BACKOFF_RESET"]
KSSCHED_WATCH_LIST_PAGE = ENV["KSSCHED_WATCH_LIST_PAGE"]
KSSCHED_WATCH_NODES = ENV["KSSCHED_WATCH_NODES"]
# Webhook mode: the cluster's default scheduler places pipeline pods, so count pods
# with the pipeline label whatever their spec.schedulerName.
KSSCHED_WATCH_ANY_SCHEDULER = ENV["KSSCHED_WATCH_ANY_SCHEDULER"]
# An events.k8s.io Event on each pipeline pod the watcher records (reason
# WarmPlacement, PartialPlacement or ColdPlacement), at most PER_SECOND a second with
# bursts of BURST; the rest are dropped and counted.
KSSCHED_PLACEMENT_EVENTS = ENV["KSSCHED_PLACEMENT_EVENTS"]
KSSCHED_PLACEMENT_EVENTS_PER_SECOND = ENV["KSSCHED_PLACEMENT_EVENTS_PER_SECOND"]
KSSCHED_PLACEMENT_EVENTS_BURST = ENV["KSSCHED_PLACEMENT_EVENTS_BURST"]
KSSCHED_LEASE_NAME = ENV["KSSCHED_LEASE_NAME"]
KSSCHED_LEASE_DURATION = ENV["KSSCHED_LEASE_DURATION"]
KSSCHED_LEASE_RENEW_DEADLINE = ENV["KSSCHED_LEASE_RENEW_DEADLINE"]
KSSCHED_LEASE_RETRY_PERIOD = ENV["KSSCHED_LEASE_RETRY_PERIOD"]
# The watcher's pod (the downward API): the lease's identity and namespace.
POD_NAME = ENV["POD_NAME"]
POD_NAMESPACE = ENV["POD_NAMESPACE"]

# --- Logging --------------------------------------------------------------------------
# The old tool's `--v=N` verbosity maps onto LOG_LEVEL: v0-1 INFO, v2-3 DEBUG.

LOG_LEVEL = ENV["LOG_LEVEL"].upper()
# text: human-readable lines; json: one JSON object per line for log collectors.
KSSCHED_LOG_FORMAT = KSSCHED_SERVER.log_format
LOGGING_CONFIG = "kssched.logformat.configure"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "kssched.logformat.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stdout",
            "formatter": KSSCHED_LOG_FORMAT,
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "django.request": {
            "handlers": ["console"],
            "level": "ERROR",
            "propagate": False,
        },
    },
}
