"""Ductor settings. Everything that varies between deployments comes from the environment.

See docs/configuration.md for every setting. Importing them starts nothing:
with no ``DATABASE_URL`` or ``REDIS_URL`` set, they name the embedded servers
recorded under ``DUCTOR_DATA_DIR``, which the commands that need them start
first (``manage.py``, the WSGI app, the Celery app; ``ductor_project.embedded.boot``).
"""

from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

import django_stubs_ext
import environ
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ductor_project import embedded
from ductor_project.core import redis_urls
from ductor_project.core.private_files import create_private

django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()


def number(name: str, default: float, *, low: float, high: float | None = None,
           cast: type[int] | type[float] = int) -> Any:
    """A numeric setting from the environment, at least ``low`` (and at most ``high``): a value that
    is not one refuses to start, naming it (a negative lease or a word would otherwise start, and
    misbehave later)."""
    raw = env.str(name, default="").strip()
    if raw == "":
        return default
    kind = "an integer" if cast is int else "a number"
    try:
        value = cast(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < low or (high is not None and value > high):
        bounds = f">= {low:g}" if high is None else f"from {low:g} to {high:g}"
        raise ImproperlyConfigured(f"{name} is {kind} {bounds}, not {raw!r}")
    return value


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def flag(name: str, default: bool) -> bool:
    """A true/false setting from the environment (1/0, true/false, yes/no, on/off, in any case);
    anything else refuses to start, naming it (``DEBUG=maybe`` was read as false)."""
    raw = env.str(name, default="").strip().lower()
    if raw == "":
        return default
    if raw not in _TRUE + _FALSE:
        raise ImproperlyConfigured(f"{name} is one of 1/0, true/false, yes/no, on/off, not {raw!r}")
    return raw in _TRUE


def options(name: str) -> dict[str, Any]:
    """A JSON object of options from the environment ({} when unset); anything else refuses to start,
    naming it."""
    raw = env.str(name, default="").strip()
    try:
        value = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} is a JSON object, and this is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} is a JSON object, not {type(value).__name__}")
    return value


def pairs(name: str) -> dict[str, str]:
    """Comma-separated ``name=value`` pairs from the environment ({} when unset); an item that is not
    one refuses to start, naming the setting (``DUCTOR_TASK_BROKERS=shop`` was a bare ValueError)."""
    found: dict[str, str] = {}
    for index, item in enumerate((part.strip() for part in env.str(name, default="").split(",")), 1):
        if not item:
            continue
        key, _, value = (part.strip() for part in item.partition("="))
        if not key or not value:
            raise ImproperlyConfigured(f"{name} is comma-separated name=value pairs; its item {index} is "
                                       f"{redis_urls.shown(item)!r}")
        found[key] = value
    return found


def listed(name: str, default: list[str]) -> list[str]:
    """A comma-separated list from the environment (``default`` when unset), each item without the
    spaces around it and empty ones left out: ``a.example, b.example`` kept " b.example", which no
    host or module is."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


_POSTGRESQL_SCHEMES = ("postgresql", "postgres", "pgsql")


def database_url(name: str, url: str) -> dict[str, Any]:
    """The connection settings of a PostgreSQL URL; any other URL refuses to start, naming the setting
    (a URL without a scheme failed later with a KeyError, and a mysql:// one was taken)."""
    scheme, separator, _ = url.partition("://")
    if not separator or scheme.lower() not in _POSTGRESQL_SCHEMES:
        schemes = ", ".join(f"{scheme}://" for scheme in _POSTGRESQL_SCHEMES)
        raise ImproperlyConfigured(f"{name} is a PostgreSQL URL ({schemes}), not {redis_urls.shown(url)!r}")
    config: dict[str, Any] = env.db_url_config(url)
    return config


DEBUG = flag("DEBUG", False)
DUCTOR_DATA_DIR = embedded.default_data_dir().resolve()


def _secret_key() -> str:
    """SECRET_KEY from the environment, or one generated once into the data dir."""
    configured = env.str("SECRET_KEY", default="")
    if configured:
        return configured
    path = DUCTOR_DATA_DIR / "secret_key"
    if not path.exists():
        # Only here: a deployment that gives SECRET_KEY (and its servers' URLs) writes nothing there.
        try:
            embedded.usable_data_dir(DUCTOR_DATA_DIR)
        except embedded.EmbeddedServiceError as exc:
            raise ImproperlyConfigured(str(exc)) from None
        create_private(path, secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = listed("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = listed("CSRF_TRUSTED_ORIGINS", [])

# Behind TLS in production (docs/configuration.md): each is off by default, for `make up` on http.
SECURE_SSL_REDIRECT = flag("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = number("SECURE_HSTS_SECONDS", 0, low=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = flag("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = flag("SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = flag("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = flag("CSRF_COOKIE_SECURE", False)
# A TLS-terminating proxy in front says so in this header (it must strip any the client sent).
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if flag("TRUST_X_FORWARDED_PROTO", False) else None
)

# What the environment does not name, the embedded servers recorded in the data dir serve (read,
# not started, here: a process that needs them has booted them first).
_embedded = embedded.recorded_urls(DUCTOR_DATA_DIR)
DATABASE_URL = env.str("DATABASE_URL", default=_embedded.database_url)
# The role that owns the tables and runs the migrations (which put row-level security on them).
# Embedded mode records it. Unset, migrate runs as DATABASE_URL's role, and refuses: row-level
# security would not bind the tables' owner (see docs/configuration.md, "Database roles").
DATABASE_OWNER_URL = env.str(
    "DATABASE_OWNER_URL", default="" if env.str("DATABASE_URL", default="") else _embedded.owner_url
)
REDIS_URL = env.str("REDIS_URL", default=_embedded.redis_url)


# Two Redis roles (docs/operations.md). Ductor's own state (the fair queue, capacity counters,
# limiters, breakers, credits, heartbeats) may be a Redis Cluster or a Sentinel setup
# (ductor_project/core/redis_urls.py has the URL forms); a bad URL refuses to start.
DUCTOR_QUEUE_REDIS_URL = env.str("DUCTOR_QUEUE_REDIS_URL", default=REDIS_URL)
redis_urls.parse(DUCTOR_QUEUE_REDIS_URL, setting=redis_urls.setting_name("DUCTOR_QUEUE_REDIS_URL"))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's assets, served from here (no CDN)
    "tenants",
    "scheduling",
    "workflows",
    "ductor_project",  # the `up` command, beside the process supervisor (ductor_project.stack)
    "ductor_project.demo",
]

MIDDLEWARE = [
    "ductor_project.parsers.UnreadBodyMiddleware",
    "ductor_project.core.metrics.RequestMetricsMiddleware",
    "ductor_project.parsers.NulCharacterMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "tenants.middleware.SessionTenantMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "ductor_project.core.errors.ServiceUnavailableMiddleware",
]

ROOT_URLCONF = "ductor_project.urls"
APPEND_SLASH = False
WSGI_APPLICATION = "ductor_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

DATABASES = {"default": database_url("DATABASE_URL", DATABASE_URL)}
# Django's PostgreSQL backend, which serves each query as its tenant (row-level security).
DATABASES["default"]["ENGINE"] = "ductor_project.core.database"
DUCTOR_DATABASE_OWNER = database_url("DATABASE_OWNER_URL", DATABASE_OWNER_URL) if DATABASE_OWNER_URL else None
# The role the app logs in as, which the migrations grant the tables' rows to.
DUCTOR_DB_APP_ROLE = DATABASES["default"]["USER"]
# The role the app switches to for code that crosses tenants on purpose (its policy shows every row).
# A blank one is the default, as a blank number is (a role named "" or " " cannot be switched to).
DUCTOR_DB_MAINTENANCE_ROLE = env.str("DUCTOR_DB_MAINTENANCE_ROLE", default="").strip() or "ductor_maintenance"
# Off only to measure what the second wall costs (bench/row_security.py): never in production.
DUCTOR_ROW_SECURITY = flag("DUCTOR_ROW_SECURITY", True)
DATABASES["default"]["CONN_MAX_AGE"] = number("DATABASE_CONN_MAX_AGE", 60, low=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# A kept connection the server answered less than this long ago is not health-checked again (a
# `SELECT 1`) before a request's or task's first query, as a connection pooler does; 0: always.
DUCTOR_DB_HEALTH_CHECK_IDLE_S = number("DATABASE_HEALTH_CHECK_IDLE_S", 1.0, low=0, cast=float)
# Parameters bound by the server, so that psycopg prepares the statements a connection runs often
# (after DATABASE_PREPARE_THRESHOLD runs: parsed and planned once, not on every call; about half
# of PostgreSQL's CPU per step, docs/performance.md). Off (false) behind a pooler in transaction
# mode that cannot keep a connection's prepared statements (PgBouncer before 1.21).
if flag("DATABASE_SERVER_SIDE_BINDING", True):
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        server_side_binding=True, prepare_threshold=number("DATABASE_PREPARE_THRESHOLD", 5, low=0)
    )
DATABASES["default"].setdefault("TEST", {})["NAME"] = env.str(
    "DATABASE_TEST_NAME", default=f"test_{DATABASES['default']['NAME']}"
)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The Django cache: on Ductor's Redis unless CACHE_REDIS_URL names another, one server or a Sentinel
# setup (not a cluster: the queue state's may be one), as django-redis reaches it; the client class
# and the options from the environment win.
CACHE_REDIS_URL = env.str("CACHE_REDIS_URL", default=REDIS_URL)
_cache = redis_urls.django_cache_config(CACHE_REDIS_URL, setting=redis_urls.setting_name("CACHE_REDIS_URL"))


def cache_client_class(name: str, default: str) -> str:
    """The dotted path of django-redis's client class; one that does not import refuses to start, naming
    the setting (it failed in Django's first system check, with an ImportError naming only the module)."""
    path = env.str(name, default="").strip() or default
    try:
        import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"{name} is the dotted path of a django-redis client class, not {path!r}: "
                                   f"{exc}") from None
    return path


CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": _cache.location,
        # Every cache key goes through the tenant-aware key builder: inside a
        # tenant "x" becomes "t:<tenant>:x"; outside any tenant it raises.
        "KEY_FUNCTION": "ductor_project.core.keys.cache_key_function",
        # 2 since the values are JSON (1 held pickles): a process of either kind reads only its own.
        "VERSION": 2,
        # JSON, never pickle: the cache's Redis is the broker's unless CACHE_REDIS_URL names another.
        "OPTIONS": {**_cache.options,
                    "CLIENT_CLASS": cache_client_class("CACHE_CLIENT_CLASS", _cache.options["CLIENT_CLASS"]),
                    "SERIALIZER": "ductor_project.core.cache_json.JSONCacheSerializer",
                    **options("CACHE_OPTIONS")},
    }
}
SESSION_ENGINE = "django.contrib.sessions.backends.db"
# The admin's messages wait in the session, not in a cookie: one shows a new API key once, and a
# cookie is logged by proxies and kept by a browser that does not follow its redirect.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
# Dates and times in the admin: 2026-12-07 14:05:09 UTC (ductor_project/formats).
FORMAT_MODULE_PATH = ["ductor_project.formats"]
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DUCTOR_DATA_DIR / "static"
# The web server serves the admin's and the API docs' assets itself (WhiteNoise): from
# STATIC_ROOT after `manage.py collectstatic` (production), else straight from the apps.
WHITENOISE_USE_FINDERS = True
try:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
except OSError:
    try:
        embedded.usable_data_dir(DUCTOR_DATA_DIR)  # says why, naming the setting
    except embedded.EmbeddedServiceError as exc:
        raise ImproperlyConfigured(str(exc)) from None
    raise

# Request bodies above this size are refused with 413 payload_too_large.
DATA_UPLOAD_MAX_MEMORY_SIZE = number("DUCTOR_MAX_REQUEST_BYTES", 1024 * 1024, low=1024)
# JSON request bodies nested deeper than this are refused with 400 malformed_json.
DUCTOR_MAX_JSON_DEPTH = number("DUCTOR_MAX_JSON_DEPTH", 64, low=2)
# A run's detail shows at most this many of its steps; /runs/{id}/steps lists them all.
DUCTOR_RUN_DETAIL_MAX_STEPS = number("DUCTOR_RUN_DETAIL_MAX_STEPS", 100, low=0)
# The bytes of step inputs, outputs, errors and traces one response carries: the run
# detail's steps, and each page of /runs/{id}/steps (which always holds at least one).
DUCTOR_STEPS_MAX_BYTES = number("DUCTOR_STEPS_MAX_BYTES", 1024 * 1024, low=1024)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.permissions.IsTenantMember"],
    "DEFAULT_THROTTLE_CLASSES": ["tenants.throttling.TenantRateThrottle"],
    "DEFAULT_PARSER_CLASSES": ["ductor_project.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_SCHEMA_CLASS": "ductor_project.core.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "ductor_project.pagination.CursorPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "ductor_project.core.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Ductor API",
    "DESCRIPTION": "Multi-tenant workflow and task platform.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Operation ids without the version: runs_list, connections_rotate_secret.
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # Every operation declares the error responses it can answer, in the one error shape; gets
    # one tag, tenant or platform (by its view's permission classes); and has Markdown descriptions.
    # One set of enum values is one enum component, wherever it is declared (name_enums); a PATCH
    # body declares no defaults (patch_bodies_without_defaults); a UUID {id} is a uuid (type_path_ids).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "ductor_project.core.openapi.name_enums",
        "ductor_project.core.openapi.patch_bodies_without_defaults",
        "ductor_project.core.openapi.type_path_ids",
        "ductor_project.core.errors.document_error_responses",
        "ductor_project.core.openapi.tag_operations",
        "ductor_project.core.openapi.render_descriptions",
    ],
    # A schema that inherits its docstring from a project base serializer gets no description.
    "GET_LIB_DOC_EXCLUDES": "ductor_project.core.openapi.doc_excluded_bases",
    # Four models have a "status": each its own enum in the schema, by name.
    "ENUM_NAME_OVERRIDES": {
        "TenantStatusEnum": "tenants.models.Tenant.Status",
        "RunStatusEnum": "workflows.models.WorkflowRun.Status",
        "StepStatusEnum": "workflows.models.StepRun.Status",
        "WaitingStatusEnum": "workflows.why.STATUSES",
        "WebhookDeliveryStatusEnum": "workflows.models.WebhookDelivery.Status",
        "WebhookEventTypeEnum": "workflows.triggers.webhooks.EVENT_TYPES",
        "StrategyEnum": "scheduling.models.Pool.Strategy",
        "ConditionOpEnum": "scheduling.templates.OPERATORS",
        "LimitNameEnum": "tenants.entitlements.LIMIT_FIELDS",
    },
    # The tags ductor_project.core.openapi.tag_operations gives: the tenant API (a tenant's key),
    # then the platform API (platform keys and superusers). Only the tags in use are listed.
    "TAGS": [
        {"name": "workflows", "description": "Workflow definitions and their immutable versions (the spec: "
                                             "`WorkflowSpec`)."},
        {"name": "runs", "description": "Start runs (idempotent with a key), list and read them, their steps, "
                                        "events and lineage; cancel them."},
        {"name": "tasks", "description": "The catalog's tasks this tenant may call from `task` nodes."},
        {"name": "triggers", "description": "What starts runs without a call of its own: cron and interval "
                                            "schedules (pause, resume, the next fire times), and events, which "
                                            "start the workflows their triggers subscribe; and webhooks, which "
                                            "tell endpoints of runs' outcomes."},
        {"name": "routing", "description": "Connections, pools and routing rules, and the routing dry run."},
        {"name": "queue", "description": "The tenant's own fair-queue backlog and share of worker time, and the "
                                         "weights of its fairness keys."},
        {"name": "tenant", "description": "The tenant the key acts for: its entitlements, usage and API keys."},
        {"name": "platform: tenants", "description": "Create, suspend and re-plan tenants; their overrides."},
        {"name": "platform: plans", "description": "The plans and their ceilings."},
        {"name": "platform: task catalog", "description": "Which Celery tasks tenants may call, and on which "
                                                          "plans."},
        {"name": "platform: queue", "description": "The global fair queue, every shard."},
    ],
}

# Celery: Redis is the broker (one server or a Sentinel setup: kombu has no Cluster transport; or
# RabbitMQ). Workers take one message at a time so that the fair order holds when execution starts,
# not only when work is enqueued. A redis+sentinel:// URL becomes kombu's sentinel:// form with its
# master_name; the transport options of the environment (JSON objects: a visibility timeout, TLS
# options, socket timeouts) win.
CELERY_BROKER_URL, _broker_options = redis_urls.kombu_config(
    env.str("CELERY_BROKER_URL", default=REDIS_URL), setting=redis_urls.setting_name("CELERY_BROKER_URL"))
CELERY_RESULT_BACKEND, _results_options = redis_urls.kombu_config(
    env.str("CELERY_RESULT_BACKEND", default=REDIS_URL), setting=redis_urls.setting_name("CELERY_RESULT_BACKEND"))
CELERY_BROKER_TRANSPORT_OPTIONS = {**_broker_options, **options("CELERY_BROKER_TRANSPORT_OPTIONS")}
# kombu's Redis transport, keeping one Redis client per channel (ductor_project/broker_transport.py);
# another broker keeps kombu's own.
CELERY_BROKER_TRANSPORT = redis_urls.kombu_transport(CELERY_BROKER_URL)
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {
    **_results_options, **options("CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS")}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_DISABLE_PREFETCH = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXPIRES = 3600
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Celery's Django fixup would close the database connection around every task (a reconnect per
# task); workers keep it instead, for CONN_MAX_AGE, health-checked (see tenants/tasking.py).
CELERY_DB_REUSE_MAX = number("CELERY_DB_REUSE_MAX", 1000, low=1)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# How long a worker process that finished an item may go on taking the next ones of its queue
# itself, per Celery message, instead of waiting for a dispatcher (0: never).
DUCTOR_HANDOFF_MS = number("DUCTOR_HANDOFF_MS", 100, low=0)
# Messages a dispatcher may publish beyond the free worker slots. With handoff a busy slot feeds
# itself, and a message published for it would wait behind its chain: none by default.
DUCTOR_DISPATCH_BUFFER = number("DUCTOR_DISPATCH_BUFFER", 0 if DUCTOR_HANDOFF_MS else 2, low=0)
# How long a dispatched item is leased to its worker (extended while it runs).
DUCTOR_LEASE_MS = number("DUCTOR_LEASE_MS", 30_000, low=1000)
# Delay before an item whose handler raised is delivered again; it doubles with each failure in a
# row of the same item, up to DUCTOR_FAILED_ITEM_MAX_DELAY_MS (an item that succeeds starts over).
DUCTOR_FAILED_ITEM_DELAY_MS = number("DUCTOR_FAILED_ITEM_DELAY_MS", 5_000, low=0)
DUCTOR_FAILED_ITEM_MAX_DELAY_MS = number("DUCTOR_FAILED_ITEM_MAX_DELAY_MS", 60_000, low=0)
if not 0 <= DUCTOR_FAILED_ITEM_DELAY_MS <= DUCTOR_FAILED_ITEM_MAX_DELAY_MS:
    raise ImproperlyConfigured("DUCTOR_FAILED_ITEM_DELAY_MS is >= 0 and at most DUCTOR_FAILED_ITEM_MAX_DELAY_MS")
# Fair by work: what the fair queue charges a tenant for an item. "time": the work it did, as
# measured on the worker (an estimate at dispatch, corrected at its ack); "items": its cost (1).
# Every process of a deployment must agree. One item is charged at most DUCTOR_FAIR_MAX_COST_MS;
# a kind of item nobody measured yet is estimated at DUCTOR_FAIR_FIRST_COST_MS.
DUCTOR_FAIR_COST = env.str("DUCTOR_FAIR_COST", default="time")
if DUCTOR_FAIR_COST not in ("time", "items"):
    raise ImproperlyConfigured(f"DUCTOR_FAIR_COST is 'time' or 'items', not {DUCTOR_FAIR_COST!r}")
DUCTOR_FAIR_MAX_COST_MS = number("DUCTOR_FAIR_MAX_COST_MS", 60_000, low=1)
DUCTOR_FAIR_FIRST_COST_MS = number("DUCTOR_FAIR_FIRST_COST_MS", 10.0, low=0, cast=float)
if DUCTOR_FAIR_MAX_COST_MS < 1 or not 0 < DUCTOR_FAIR_FIRST_COST_MS <= DUCTOR_FAIR_MAX_COST_MS:
    raise ImproperlyConfigured("DUCTOR_FAIR_MAX_COST_MS is >= 1 and DUCTOR_FAIR_FIRST_COST_MS in (0, max]")

# Redis keys of every tenant carry the hash tag of the fair-queue shard the
# tenant maps to, so Lua scripts stay inside one Redis Cluster slot. At most one shard per slot of
# a Redis Cluster, the most queue_reshard puts in force (scheduling.resharding.MAX_SHARDS): a count
# above it started, and no reshard could keep it.
DUCTOR_QUEUE_SHARDS = number("DUCTOR_QUEUE_SHARDS", 1, low=1, high=16384)

# Modules whose @action functions workflows may call (the built-ins are always there).
DUCTOR_ACTION_MODULES = listed("DUCTOR_ACTION_MODULES", ["workflows.actions"])
# Task nodes: the brokers a celery connection may name besides "default" (Ductor's own broker),
# as name=url pairs ("shop=redis://shop-redis:6379/0"), and a task step's timeout when neither its
# node nor its catalog entry sets one (it is the task's lease: a worker that died with the task is
# noticed then).
DUCTOR_TASK_BROKERS = pairs("DUCTOR_TASK_BROKERS")
DUCTOR_TASK_TIMEOUT_S = number("DUCTOR_TASK_TIMEOUT_S", 300.0, low=1, cast=float)
# The slots of the team's worker queues that tenants share ("shop=8,eu/billing=4": queue, or
# broker/queue, = how many of its tasks may be in flight at once, across every tenant): task steps
# for such a queue are admitted in the fair order within them, so that the order holds where the
# team's workers start the work. A queue not listed is bounded by its pools' and connections'
# concurrency only.
DUCTOR_TASK_QUEUE_SLOTS = pairs("DUCTOR_TASK_QUEUE_SLOTS")
# Largest number of nodes in one workflow spec, and deepest JSON nesting.
DUCTOR_MAX_SPEC_NODES = number("DUCTOR_MAX_SPEC_NODES", 500, low=1)
DUCTOR_MAX_SPEC_DEPTH = number("DUCTOR_MAX_SPEC_DEPTH", 32, low=2)
# Most signals one run keeps (as a workflow engine caps a history): the next answers 409 naming
# ``signals``, until the run continues as new.
DUCTOR_MAX_SIGNALS_PER_RUN = number("DUCTOR_MAX_SIGNALS_PER_RUN", 10_000, low=1)
# Schedules: the most due schedules of one tenant that one wake-up fires (the rest follow in the
# next, at once), and how often a schedule holding a buffered fire looks whether its run ended.
DUCTOR_SCHEDULE_FIRE_BATCH = number("DUCTOR_SCHEDULE_FIRE_BATCH", 500, low=1)
DUCTOR_SCHEDULE_BUFFER_CHECK_S = number("DUCTOR_SCHEDULE_BUFFER_CHECK_S", 1.0, low=0.01, cast=float)
# Webhooks (docs/triggers.md#webhooks): each attempt's timeout; the attempts of a delivery before it
# fails; the first retry's delay (doubled per attempt, jittered, at most an hour); the consecutive
# failed attempts that disable an endpoint; and the endpoints one tenant may have.
DUCTOR_WEBHOOK_TIMEOUT_S = number("DUCTOR_WEBHOOK_TIMEOUT_S", 10.0, low=0.1, cast=float)
DUCTOR_WEBHOOK_MAX_ATTEMPTS = number("DUCTOR_WEBHOOK_MAX_ATTEMPTS", 8, low=1)
DUCTOR_WEBHOOK_BACKOFF_S = number("DUCTOR_WEBHOOK_BACKOFF_S", 10.0, low=0, cast=float)
DUCTOR_WEBHOOK_DISABLE_AFTER = number("DUCTOR_WEBHOOK_DISABLE_AFTER", 20, low=1)
DUCTOR_WEBHOOKS_PER_TENANT = number("DUCTOR_WEBHOOKS_PER_TENANT", 20, low=0)
# The event triggers one tenant may have: each event is matched against every enabled trigger of its
# name, in the request that sends it.
DUCTOR_TRIGGERS_PER_TENANT = number("DUCTOR_TRIGGERS_PER_TENANT", 100, low=0)
# Most webhook deliveries of one tenant in flight at once (each holds a worker slot while it waits).
DUCTOR_WEBHOOK_CONCURRENCY = number("DUCTOR_WEBHOOK_CONCURRENCY", 2, low=1)

# Fernet keys for connection secrets (comma-separated; first encrypts, all decrypt).
# Empty: one key is generated once into the data dir.
DUCTOR_SECRET_KEYS = listed("DUCTOR_SECRET_KEYS", [])
# Outbound http.request to loopback, private and link-local addresses is refused unless this is on.
DUCTOR_HTTP_ALLOW_PRIVATE = flag("DUCTOR_HTTP_ALLOW_PRIVATE", False)
# Consecutive failures that open a connection's circuit breaker, and its cooldown.
DUCTOR_BREAKER_FAILURES = number("DUCTOR_BREAKER_FAILURES", 5, low=1)
DUCTOR_BREAKER_COOLDOWN_S = number("DUCTOR_BREAKER_COOLDOWN_S", 30.0, low=0, cast=float)

# Observability (docs/operations.md). A loop (coordinator, dispatcher) whose last heartbeat is older
# than this is stale: /readyz says so and `manage.py up` restarts it.
DUCTOR_HEARTBEAT_STALE_S = number("DUCTOR_HEARTBEAT_STALE_S", 15.0, low=1, cast=float)
# /metrics (Prometheus): served while on; with a token, only to "Authorization: Bearer <token>"; without one,
# only to loopback (the per-tenant series name tenants).
DUCTOR_METRICS_ENABLED = flag("DUCTOR_METRICS_ENABLED", True)
DUCTOR_METRICS_TOKEN = env.str("DUCTOR_METRICS_TOKEN", default="")
# Per-tenant series: the N tenants with the largest backlog, the others summed as tenant_id="other".
DUCTOR_METRICS_TOP_TENANTS = number("DUCTOR_METRICS_TOP_TENANTS", 20, low=0)
# The queue's gauges are read from Redis at most this often; a scrape in between reuses them.
DUCTOR_METRICS_QUEUE_EVERY_S = number("DUCTOR_METRICS_QUEUE_EVERY_S", 5.0, low=0, cast=float)


def writable_directory(name: str, what: str) -> str:
    """A directory from the environment that this process can write in ("" when unset); anything else
    refuses to start, naming it."""
    raw = env.str(name, default="")
    if raw and not (os.path.isdir(raw) and os.access(raw, os.W_OK | os.X_OK)):
        raise ImproperlyConfigured(f"{name} is a directory this process can write {what} in, not {raw!r}")
    return raw


# Where each process writes its metric samples (prometheus_client reads the variable itself, as its
# first metric is made): one that is missing failed there with a FileNotFoundError.
PROMETHEUS_MULTIPROC_DIR = writable_directory("PROMETHEUS_MULTIPROC_DIR", "its metrics")

DUCTOR_LOG_FORMAT = env.str("DUCTOR_LOG_FORMAT", default="json")
DUCTOR_LOG_LEVEL = env.str("DUCTOR_LOG_LEVEL", default="INFO").strip().upper()
if DUCTOR_LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    raise ImproperlyConfigured(f"DUCTOR_LOG_LEVEL is DEBUG, INFO, WARNING, ERROR or CRITICAL, not {DUCTOR_LOG_LEVEL!r}")
LOGGING_CONFIG = None

from ductor_project.logs import configure_logging  # noqa: E402

configure_logging(fmt=DUCTOR_LOG_FORMAT, level=DUCTOR_LOG_LEVEL)
