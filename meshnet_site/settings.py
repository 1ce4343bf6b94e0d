"""Settings for every process (tracker, worker, node), read from the environment.

With no environment set, everything runs embedded on one machine: a SQLite
file, the in-memory channel layer, route statistics in process and a Celery
broker that needs no server. ``DATABASE_URL`` selects PostgreSQL and
``REDIS_URL`` selects channels_redis, Celery on Redis and Redis-merged route
statistics. Values are read only through ``meshnet_site.environment``, which
fails loudly on a bad value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import django_stubs_ext
from rest_framework import serializers

from meshnet_site import environment as env_

# Lets admin and serializer classes be written with their type parameters
# (ModelAdmin[Node], Serializer[dict]) at run time, as mypy checks them.
django_stubs_ext.monkeypatch(extra_classes=[serializers.Serializer, serializers.ModelSerializer])

ENV = os.environ
BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = env_.var_dir(ENV, BASE_DIR)

DEBUG = env_.env_bool(ENV, "DJANGO_DEBUG", default=False)

# Production (DATABASE_URL set: several processes, maybe several machines)
# must share one explicit key. The embedded single-machine mode keeps a random
# key of its own in var/ so that `make demo` needs no configuration and no key
# is ever hard-coded.
SECRET_KEY = env_.secret_key(ENV, VAR_DIR)

ALLOWED_HOSTS = env_.env_list(ENV, "DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
# Behind a load balancer that ends TLS, the browser's origin is https://… while
# the tracker sees http: name the public origins, and trust the balancer's
# X-Forwarded-Proto, or every login and dashboard chat fails the CSRF check.
CSRF_TRUSTED_ORIGINS = env_.env_list(ENV, "DJANGO_CSRF_TRUSTED_ORIGINS", [])
behind_tls_proxy = env_.env_bool(ENV, "DJANGO_BEHIND_TLS_PROXY", default=False)
if behind_tls_proxy:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# A proxy or load balancer in front: every client then arrives from its address, so
# what REMOTE_ADDR says about a client is no ground for trust (/metrics needs its token).
MESHNET_BEHIND_PROXY = behind_tls_proxy or env_.env_bool(ENV, "MESHNET_BEHIND_PROXY", default=False)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "django_prometheus",
    "django_celery_beat",
    "django_celery_results",
    "meshnet_site.outbox",
    "meshnet_site.guards",
    "nodes_app",
    "routing_app",
    "tracker_app",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "meshnet_site.middleware.DatabaseOutageMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "meshnet_site.urls"
ASGI_APPLICATION = "meshnet_site.asgi.application"

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

DATABASES = {"default": env_.database_config(ENV, VAR_DIR)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CHANNEL_LAYERS = env_.channel_layers_config(ENV)
CACHES = env_.cache_config(ENV)
REDIS_URL = env_.redis_url(ENV)

_broker = env_.celery_broker_config(ENV, VAR_DIR)
CELERY_BROKER_URL = _broker["broker_url"]
CELERY_BROKER_TRANSPORT = _broker["broker_transport"]
CELERY_BROKER_TRANSPORT_OPTIONS = _broker["broker_transport_options"]
# Results are kept (django-celery-results, in the admin) only for the tasks
# that ask for them: the prune, probe and audit runs, not every liveness sweep.
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = "django-db"
CELERY_RESULT_EXTENDED = True
CELERY_TIMEZONE = "UTC"
# Schedules live in the database (django-celery-beat): an operator edits the
# intervals in the admin; a migration writes the defaults (ADR-0007). Only
# intervals set explicitly in the environment are written over them at start.
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_BEAT_SCHEDULE = env_.beat_schedule_pins(ENV)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The dashboard's own assets (and vendored libraries, see static/vendor/).
STATICFILES_DIRS = [BASE_DIR / "static"]
# The admin's and dashboard's assets are served by the tracker itself, straight
# from the static folders: no collectstatic step, no separate web server. (So
# no STATIC_ROOT either: WhiteNoise would scan it and warn while it is absent;
# set one only to collect the files for another web server.)
WHITENOISE_USE_FINDERS = True

# Staff sign in to the dashboard here; anonymous visitors are sent to it.
LOGIN_URL = "dashboard-login"
LOGIN_REDIRECT_URL = "dashboard"

REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    # DRF's defaults, with JSON nested too deeply a 400 (meshnet_site.parsers).
    "DEFAULT_PARSER_CLASSES": [
        "meshnet_site.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PERMISSION_CLASSES": [],
    "EXCEPTION_HANDLER": "meshnet_site.errors.openai_exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Meshnet tracker API",
    "DESCRIPTION": "Node registry, routing and OpenAI-compatible chat for a Meshnet network.",
    "VERSION": "0.1.0",
    # 3.1: JSON Schema 2020-12, whose contentSchema describes the chat stream's events.
    "OAS_VERSION": "3.1.0",
    # Request and response components apart: only requests refuse a blank string.
    "COMPONENT_SPLIT_REQUEST": True,
    # The chat consumer, health and metrics are served outside DRF; the hook adds
    # their documentation (tracker_app.completions.schema), and the schema tests check all of it
    # against a live tracker.
    "PREPROCESSING_HOOKS": ["tracker_app.completions.schema.add_endpoints_outside_drf"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "meshnet_site.api_schema.add_security_schemes",
    ],
    "ENUM_NAME_OVERRIDES": {
        "NodeStatusEnum": "nodes_app.models.NodeStatus",
        "RouteStatusEnum": "routing_app.api.ROUTE_STATUSES",
        "ErrorTypeEnum": "meshnet_site.api_schema.ERROR_TYPES",
        "ChatRoleEnum": "tracker_app.completions.chat_request.ROLES",
        "AssistantRoleEnum": ["assistant"],
        "TextCompletionObjectEnum": ["text_completion"],
        "HealthStateEnum": ["ok", "unavailable"],
        "PlacementRuleEnum": "routing_app.api.PLACEMENT_RULES",
        "FinishReasonEnum": ["stop", "length"],
        "ChatFinishReasonEnum": ["stop", "length", "tool_calls"],
        "FunctionToolTypeEnum": ["function"],
    },
}

if not DEBUG:
    SESSION_COOKIE_HTTPONLY = True
    CSRF_COOKIE_HTTPONLY = True
    X_FRAME_OPTIONS = "DENY"
    SECURE_CONTENT_TYPE_NOSNIFF = True

# --- Meshnet ---------------------------------------------------------------

# Routing (ADR-0021). `runtracker` flags override these after validation; the
# defaults and ranges are defined once, in meshnet_site.environment.
MESHNET_ROUTE_EXPLORE_SHARE = env_.ROUTE_EXPLORE_SHARE.read(ENV)
MESHNET_ROUTE_WEIGHT_ALPHA = env_.ROUTE_WEIGHT_ALPHA.read(ENV)
MESHNET_ROUTE_STATS_HALF_LIFE = env_.ROUTE_STATS_HALF_LIFE.read(ENV)
MESHNET_ROUTE_MIN_SAMPLE_TOKENS = int(env_.ROUTE_MIN_SAMPLE_TOKENS.read(ENV))
# The route choice policy and its own knobs (ADR-0011).
MESHNET_ROUTE_POLICY = env_.ROUTE_POLICY.read(ENV)
MESHNET_ROUTE_MAX_UNSAMPLED = env_.ROUTE_MAX_UNSAMPLED.read(ENV)
MESHNET_ROUTE_LOAD_EXPONENT = env_.ROUTE_LOAD_EXPONENT.read(ENV)

# Durable route statistics (ADR-0003): this tracker's name in the database
# ("" until `runtracker` derives it from host and port), how long an arm
# without a sample is kept, and how long its snapshots are.
MESHNET_TRACKER_ID = env_.tracker_id(ENV)
MESHNET_ROUTE_ARM_TTL = env_.ROUTE_ARM_TTL.read(ENV)
MESHNET_ROUTE_SNAPSHOT_RETENTION = env_.ROUTE_SNAPSHOT_RETENTION.read(ENV)

# Billing audits (ADR-0007): the window each run reads, and how few output
# tokens make a multi-hop completion that did not stop naturally suspicious.
MESHNET_AUDIT_WINDOW = env_.AUDIT_WINDOW.read(ENV)
MESHNET_AUDIT_SHORT_COMPLETION_TOKENS = int(env_.AUDIT_SHORT_COMPLETION_TOKENS.read(ENV))
# The probe's sample of served requests (ADR-0007): kept per model, for how long, and
# how many each probe run re-runs on other routes.
MESHNET_PROBE_SAMPLE_SIZE = int(env_.PROBE_SAMPLE_SIZE.read(ENV))
MESHNET_PROBE_SAMPLE_MAX_AGE = env_.PROBE_SAMPLE_MAX_AGE.read(ENV)
MESHNET_PROBE_SAMPLE_CHECKS = int(env_.PROBE_SAMPLE_CHECKS.read(ENV))

# Node liveness: a node silent for this long is marked offline by the sweep.
MESHNET_NODE_HEARTBEAT_INTERVAL = env_.env_float(
    ENV, "MESHNET_NODE_HEARTBEAT_INTERVAL", 5.0, minimum=0.1
)
MESHNET_NODE_HEARTBEAT_TIMEOUT = env_.env_float(
    ENV, "MESHNET_NODE_HEARTBEAT_TIMEOUT", 30.0, minimum=1.0
)
# Proven endpoints (ADR-0008): the networks node endpoints may lie in, how
# long an offline node's row is kept, and the most tokens/s a node may claim.
MESHNET_NODE_NETWORKS = env_.node_networks(ENV)
MESHNET_NODE_RETENTION = env_.NODE_RETENTION.read(ENV)
MESHNET_NODE_MAX_BENCHMARK_TPS = env_.NODE_MAX_BENCHMARK_TPS.read(ENV)
# Billing: the network's share of every charge; the rest goes to the hops.
MESHNET_NETWORK_FEE_SHARE = env_.env_decimal(
    ENV, "MESHNET_NETWORK_FEE_SHARE", "0.05", minimum="0", maximum="1"
)

# Every request body, on every path, refused on its headers past this size
# (meshnet_site.asgi_limits); Django's own cap on reading a body agrees.
MESHNET_MAX_REQUEST_BYTES = int(env_.MAX_REQUEST_BYTES.read(ENV))
DATA_UPLOAD_MAX_MEMORY_SIZE = MESHNET_MAX_REQUEST_BYTES

# Deadlines (ADR-0004): the most a chat request waits in all for a busy route's
# slot, and the seconds a node may take for one step (``runnode --step-timeout``).
MESHNET_BUSY_DEADLINE = env_.BUSY_DEADLINE.read(ENV)
MESHNET_HOP_STEP_TIMEOUT = env_.HOP_STEP_TIMEOUT.read(ENV)
# The most choices (n, times a legacy completion's prompts) one request may ask for.
MESHNET_MAX_CHOICES = int(env_.MAX_CHOICES.read(ENV))

# The most time one request may take in all, whatever its heads stream.
MESHNET_REQUEST_DEADLINE = env_.REQUEST_DEADLINE.read(ENV)
# Each API key's share: requests and reserved KV tokens in flight (admin overrides
# per key), held by leases that expire unless renewed.
MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT = int(env_.KEY_MAX_REQUESTS_IN_FLIGHT.read(ENV))
MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT = int(env_.KEY_MAX_KV_TOKENS_IN_FLIGHT.read(ENV))
MESHNET_KEY_LEASE_SECONDS = env_.KEY_LEASE_SECONDS.read(ENV)

# Client API: chat requests per API key per minute (429 beyond).
MESHNET_RATE_LIMIT_PER_MINUTE = env_.env_int(ENV, "MESHNET_RATE_LIMIT_PER_MINUTE", 120, minimum=1)
# Node registrations per client address per minute (429 beyond), counted before
# any signature is checked. An IPv6 client is counted by its /64 network.
MESHNET_REGISTRATION_RATE_LIMIT = env_.env_int(
    ENV, "MESHNET_REGISTRATION_RATE_LIMIT", 30, minimum=1
)
# Anonymous placement queries (GET /api/nodes/placement) per client address per minute.
MESHNET_PLACEMENT_RATE_LIMIT = env_.env_int(ENV, "MESHNET_PLACEMENT_RATE_LIMIT", 60, minimum=1)

# /metrics: a Bearer token it requires when set; unset, only a direct loopback client
# gets it (no forwarding header, not MESHNET_BEHIND_PROXY): meshnet_site.metrics_access.
MESHNET_METRICS_TOKEN = env_.metrics_token(ENV)

# The tracker's plan-signing key (nodes pin its public half, published at
# /.well-known/meshnet-tracker-key) and how long a signed plan may open sessions.
MESHNET_TRACKER_KEY_FILE = env_.tracker_key_file(ENV, VAR_DIR)
MESHNET_PLAN_VALIDITY = env_.PLAN_VALIDITY.read(ENV)

# How far a signed registration's timestamp may be from the tracker's clock.
MESHNET_REGISTRATION_MAX_SKEW = 300.0

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # One line per proxied request or hop step would drown the useful lines.
        "httpx": {"level": "WARNING"},
    },
}
