"""Typed readers for the environment: the one place configuration comes from.

Every reader takes the environment mapping explicitly, so settings can be
built and tested from any mapping, and raises ``ImproperlyConfigured`` with
the variable's name and the offending value when a value does not parse or
is out of range.

Numeric settings that other code also receives (``RoutePolicyConfig`` built in
code, ``runtracker`` flags) are defined once as ``NumberSetting`` values at
the end of this module: name, default and range, so every entry point
refuses the same values. This module imports no app, so every app can use it.
"""

from __future__ import annotations

import ipaddress
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from meshnet_site.files import create_once

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    """Read a boolean written as 1/0, true/false, yes/no or on/off."""
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {raw!r}")


def env_float(
    env: Mapping[str, str],
    name: str,
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
) -> float:
    """Read a float and check it against its allowed range."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    return check_range(
        name, value, minimum=minimum, maximum=maximum, exclusive_minimum=exclusive_minimum
    )


def env_int(
    env: Mapping[str, str],
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """Read an integer and check it against its allowed range."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    check_range(name, value, minimum=minimum, maximum=maximum)
    return value


def env_decimal(
    env: Mapping[str, str], name: str, default: str, *, minimum: str, maximum: str
) -> Decimal:
    """Read a Decimal (money and money ratios are never floats)."""
    raw = env.get(name)
    text = default if raw is None or raw.strip() == "" else raw.strip()
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ImproperlyConfigured(f"{name} must be a decimal number, got {raw!r}") from None
    if not value.is_finite() or not Decimal(minimum) <= value <= Decimal(maximum):
        raise ImproperlyConfigured(f"{name} must lie in [{minimum}, {maximum}], got {raw!r}")
    return value


def env_list(env: Mapping[str, str], name: str, default: list[str]) -> list[str]:
    """Read a comma-separated list; blank items are dropped."""
    raw = env.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


# Networks nodes may register from unless MESHNET_NODE_NETWORKS says otherwise:
# loopback and the private ranges (a network like ADR-0020's runs on a LAN).
DEFAULT_NODE_NETWORKS = (
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "fc00::/7",
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def node_networks(env: Mapping[str, str]) -> tuple[IPNetwork, ...]:
    """MESHNET_NODE_NETWORKS: comma-separated CIDRs a node endpoint's addresses must lie in.

    Default: loopback and private ranges. Link-local and cloud-metadata
    addresses are refused whatever this says (``nodes_app.endpoints``).
    """
    items = env_list(env, "MESHNET_NODE_NETWORKS", list(DEFAULT_NODE_NETWORKS))
    if not items:
        raise ImproperlyConfigured("MESHNET_NODE_NETWORKS must name at least one network")
    networks: list[IPNetwork] = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"MESHNET_NODE_NETWORKS must be comma-separated CIDRs, got {item!r}"
            ) from None
    return tuple(networks)


def check_range(
    name: str,
    value: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
) -> float:
    """Return ``value`` when it lies in range, else raise ImproperlyConfigured."""
    if value != value:  # NaN compares unequal to itself
        raise ImproperlyConfigured(f"{name} must be a number, got NaN")
    if minimum is not None:
        if exclusive_minimum and value <= minimum:
            raise ImproperlyConfigured(f"{name} must be greater than {minimum}, got {value}")
        if not exclusive_minimum and value < minimum:
            raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, got {value}")
    return value


def var_dir(env: Mapping[str, str], base_dir: Path) -> Path:
    """MESHNET_VAR_DIR: where this installation keeps its state (embedded database,
    broker folders, secret key, wallets, logs); default ``<project>/var``.

    Anchored at the project, never at the working directory; a throwaway
    network (tests, benchmarks) points it at a folder of its own.
    """
    value = env.get("MESHNET_VAR_DIR", "").strip()
    if not value:
        return base_dir / "var"
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise ImproperlyConfigured(f"MESHNET_VAR_DIR must be an absolute path, got {value!r}")
    return path


def tracker_key_file(env: Mapping[str, str], var_dir: Path) -> Path:
    """MESHNET_TRACKER_KEY_FILE: the tracker's ed25519 plan-signing key (hex, mode 0600).

    Default ``<MESHNET_VAR_DIR>/tracker_key``, created on first use. Every
    tracker and worker of one deployment must read the same key: nodes pin it.
    """
    value = env.get("MESHNET_TRACKER_KEY_FILE", "").strip()
    if not value:
        return var_dir / "tracker_key"
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise ImproperlyConfigured(
            f"MESHNET_TRACKER_KEY_FILE must be an absolute path, got {value!r}"
        )
    return path


# Seconds to wait for PostgreSQL to accept a connection (libpq's connect_timeout).
DATABASE_CONNECT_TIMEOUT = 5
# Seconds a request waits for a free pooled connection before its 503: short,
# because the consumers' database calls share one thread, where each wait
# holds up the calls queued behind it while the database is away.
DATABASE_POOL_TIMEOUT = 2
# Seconds the pool retries a failed connection (backing off 1, 2 s) before it
# gives up and lets the next request start afresh: a database that came back
# is used within about two seconds.
DATABASE_RECONNECT_SECONDS = 3


def database_config(env: Mapping[str, str], var_dir: Path) -> dict[str, Any]:
    """PostgreSQL (or any dj-database-url URL) from DATABASE_URL, else a SQLite file.

    PostgreSQL connections come from one pool per process
    (``MESHNET_DATABASE_POOL_SIZE``): under ASGI every concurrent request to a
    plain view runs on a thread of its own, and persistent per-thread
    connections grew with the load until PostgreSQL refused more (200
    concurrent ``/healthz``: 106 "too many clients"). A request past the pool
    waits ``DATABASE_POOL_TIMEOUT`` for a connection, then gets a 503
    (``database_unavailable``); each connection is checked before it is
    handed out, and a database that came back is used without a restart.
    """
    url = env.get("DATABASE_URL", "").strip() or f"sqlite:///{var_dir / 'meshnet.sqlite3'}"
    try:
        # No persistent connections (the pool keeps them); a pooled connection
        # is checked before it is handed out.
        config: dict[str, Any] = dict(dj_database_url.parse(url, conn_health_checks=True))
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not a database URL: {exc}") from None
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # Several processes (tracker, worker) write the file, and concurrent
        # node registrations write from several threads: each transaction
        # takes the write lock when it begins and waits for it, where a
        # deferred one upgrading its lock fails at once ("database is locked").
        config["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}
    if config["ENGINE"] == "django.db.backends.postgresql":
        options = config.setdefault("OPTIONS", {})
        # A server that takes the connection and never answers must give a 503
        # (``database_unavailable``), not a request that hangs; the URL's own
        # ``?connect_timeout=`` wins.
        options.setdefault("connect_timeout", DATABASE_CONNECT_TIMEOUT)
        options["pool"] = {
            "min_size": 1,
            "max_size": int(DATABASE_POOL_SIZE.read(env)),
            "timeout": DATABASE_POOL_TIMEOUT,
            "reconnect_timeout": DATABASE_RECONNECT_SECONDS,
        }
    return config


def channel_layers_config(env: Mapping[str, str]) -> dict[str, Any]:
    """channels_redis's pub/sub layer when REDIS_URL is set, else the in-process layer.

    Pub/sub, not the list-based ``RedisChannelLayer``: dashboards connect and
    disconnect all the time, and the list-based layer can drop a message meant
    for one consumer while another one in the same process is cancelled
    (ADR-0009). A dashboard needs no queued delivery: it takes a snapshot on
    connect and live updates after.
    """
    url = redis_url(env)
    if url is None:
        return {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    return {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [url], "prefix": "meshnet:channels"},
        }
    }


def cache_config(env: Mapping[str, str]) -> dict[str, Any]:
    """Redis as the cache when set, else local memory.

    No guard lives in a cache, where other entries can evict it: the
    registration replay guard and the rate limits are database rows
    (``meshnet_site.guards``).
    """
    url = redis_url(env)
    if url is None:
        return {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": "meshnet",
        }
    }


def celery_broker_config(env: Mapping[str, str], var_dir: Path) -> dict[str, Any]:
    """Celery on Redis when REDIS_URL is set, else a broker that needs no server.

    Task results go to the database (django-celery-results), not the broker.

    The embedded broker is kombu's filesystem transport (with whole-message
    writes, ``meshnet_site.celery_broker``): the tracker and the worker are
    separate processes on one machine, so an in-memory broker would not reach
    the worker, while a shared folder does.
    """
    url = redis_url(env)
    if url is not None:
        return {"broker_url": url, "broker_transport": None, "broker_transport_options": {}}
    folder = var_dir / "celery"
    return {
        "broker_url": "filesystem://",
        "broker_transport": "meshnet_site.celery_broker:Transport",
        "broker_transport_options": {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            # kombu's default is "control" in the working directory.
            "control_folder": str(folder / "control"),
            "store_processed": False,
        },
    }


def redis_url(env: Mapping[str, str]) -> str | None:
    """REDIS_URL when set, checked for a redis:// or rediss:// scheme."""
    url = env.get("REDIS_URL", "").strip()
    if not url:
        return None
    if not url.startswith(("redis://", "rediss://", "unix://")):
        # The value is not echoed: a Redis URL may hold a password.
        raise ImproperlyConfigured("REDIS_URL must start with redis://, rediss:// or unix://")
    return url


def secret_key(env: Mapping[str, str], var_dir: Path) -> str:
    """DJANGO_SECRET_KEY, or in the embedded mode a random key kept in var/.

    With DATABASE_URL set the deployment is shared, so the key must be given.
    """
    key = env.get("DJANGO_SECRET_KEY", "").strip()
    if key:
        return key
    if env.get("DATABASE_URL", "").strip():
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when DATABASE_URL is set")
    path = var_dir / "secret_key"
    create_once(path, secrets.token_urlsafe(50))
    return path.read_text().strip()


@dataclass(frozen=True)
class NumberSetting:
    """One numeric setting's single definition: environment variable, default and range.

    ``read`` takes it from the environment; ``check`` holds a value that
    arrived another way (a flag, a constructor argument) to the same range,
    raising ``ImproperlyConfigured`` that names ``label`` (default: the
    variable). ``integer`` settings refuse non-integral values when read.
    """

    name: str
    default: float
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    integer: bool = False

    def read(self, env: Mapping[str, str]) -> float:
        if self.integer:
            return self.check(env_int(env, self.name, int(self.default)))
        return self.check(env_float(env, self.name, self.default))

    def check(self, value: float, *, label: str | None = None) -> float:
        return check_range(
            label or self.name,
            value,
            minimum=self.minimum,
            maximum=self.maximum,
            exclusive_minimum=self.exclusive_minimum,
        )


@dataclass(frozen=True)
class ChoiceSetting:
    """One setting that names one of a fixed set of values (e.g. a policy).

    ``read`` takes it from the environment (blank: the default); ``check``
    holds a value that arrived another way (a flag) to the same choices,
    raising ``ImproperlyConfigured`` that names ``label`` (default: the variable).
    """

    name: str
    default: str
    choices: tuple[str, ...]

    def read(self, env: Mapping[str, str]) -> str:
        raw = env.get(self.name)
        if raw is None or raw.strip() == "":
            return self.default
        return self.check(raw.strip())

    def check(self, value: str, *, label: str | None = None) -> str:
        if value not in self.choices:
            allowed = ", ".join(self.choices)
            raise ImproperlyConfigured(
                f"{label or self.name} must be one of {allowed}, got {value!r}"
            )
        return value


# The route choice (ADR-0011): which policy, and the load-aware policy's knobs.
ROUTE_POLICY = ChoiceSetting(
    "MESHNET_ROUTE_POLICY", "thompson-load", choices=("thompson-load", "adr0021")
)
ROUTE_MAX_UNSAMPLED = NumberSetting("MESHNET_ROUTE_MAX_UNSAMPLED", 900.0, minimum=1.0)
ROUTE_LOAD_EXPONENT = NumberSetting("MESHNET_ROUTE_LOAD_EXPONENT", 0.5, minimum=0.0, maximum=4.0)

# The routing policy (ADR-0021).
ROUTE_EXPLORE_SHARE = NumberSetting("MESHNET_ROUTE_EXPLORE_SHARE", 0.3, minimum=0.0, maximum=1.0)
ROUTE_WEIGHT_ALPHA = NumberSetting(
    "MESHNET_ROUTE_WEIGHT_ALPHA", 1.0, minimum=0.0, exclusive_minimum=True
)
ROUTE_STATS_HALF_LIFE = NumberSetting(
    "MESHNET_ROUTE_STATS_HALF_LIFE", 600.0, minimum=0.0, exclusive_minimum=True
)
ROUTE_MIN_SAMPLE_TOKENS = NumberSetting(
    "MESHNET_ROUTE_MIN_SAMPLE_TOKENS", 8, minimum=1, integer=True
)

# The largest request body the tracker reads (413 beyond; a chunked body without
# Content-Length is a 411). The heads' own cap (runnode --max-request-bytes,
# 8 MiB by default) must stay above it, or heads refuse what the tracker took.
MAX_REQUEST_BYTES = NumberSetting("MESHNET_MAX_REQUEST_BYTES", 2**20, minimum=1024, integer=True)

# Deadlines of a chat request (ADR-0004, "Deadlines"): how long in all it may wait
# for a slot on a route whose nodes are at their session cap (503 route_busy
# beyond), and how long one node may take to answer one step of a generation
# (up to ``nodes_app.protocol.limits.STEP_TIMEOUT_POSITIONS`` positions; a longer
# prefill gets one more per block). ``runnode --step-timeout`` defaults to the
# latter; the node runtime's own default (no Django) is the same 30 s.
BUSY_DEADLINE = NumberSetting("MESHNET_BUSY_DEADLINE", 120.0, minimum=1.0, maximum=3600.0)
HOP_STEP_TIMEOUT = NumberSetting("MESHNET_HOP_STEP_TIMEOUT", 30.0, minimum=1.0, maximum=600.0)

# The total time one completion request may take, whatever its heads stream
# (ADR-0004, "Deadlines"): ``: step`` comments keep a head from being taken for
# hung, never this. Past it the request fails unbilled and its heads are blamed.
REQUEST_DEADLINE = NumberSetting("MESHNET_REQUEST_DEADLINE", 1800.0, minimum=1.0, maximum=86400.0)

# Each API key's share of the network (ADR-0004, "Auth and limits"): requests in
# flight at once, and KV tokens those requests may reserve in all ((prompt +
# max_tokens) × choices each); the admin overrides both per key. A request's
# lease on its share lasts this long unless renewed (a third of it each time),
# so a tracker that dies holds a share that long at most.
KEY_MAX_REQUESTS_IN_FLIGHT = NumberSetting(
    "MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT", 16, minimum=1, maximum=2**31 - 1, integer=True
)
KEY_MAX_KV_TOKENS_IN_FLIGHT = NumberSetting(
    "MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT", 32768, minimum=1, maximum=2**31 - 1, integer=True
)
KEY_LEASE_SECONDS = NumberSetting("MESHNET_KEY_LEASE_SECONDS", 60.0, minimum=3.0, maximum=3600.0)

# The most choices one completion request may ask for (OpenAI's ``n``, times the
# prompts of a legacy completion's list): each is a generation of its own, run
# at once with the others, holding a session on every node of its route.
# 128 is OpenAI's own ceiling for ``n``.
MAX_CHOICES = NumberSetting("MESHNET_MAX_CHOICES", 4, minimum=1, maximum=128, integer=True)

# PostgreSQL connections one process holds at most (its pool; see database_config).
DATABASE_POOL_SIZE = NumberSetting(
    "MESHNET_DATABASE_POOL_SIZE", 20, minimum=1, maximum=1000, integer=True
)

# Durable route learning and its pruning (ADR-0003).
ROUTE_ARM_TTL = NumberSetting("MESHNET_ROUTE_ARM_TTL", 24 * 3600.0, minimum=1.0)
ROUTE_SNAPSHOT_RETENTION = NumberSetting(
    "MESHNET_ROUTE_SNAPSHOT_RETENTION", 7 * 24 * 3600.0, minimum=1.0
)

# How long a plan the tracker signs may open sessions on nodes (not how long a
# generation may run); nodes refuse plans valid longer than the protocol's 600 s.
PLAN_VALIDITY = NumberSetting("MESHNET_PLAN_VALIDITY", 60.0, minimum=1.0, maximum=600.0)

# Background jobs (ADR-0007). Each interval is the default a migration writes
# into the database schedule (django-celery-beat, edited in the admin); set in
# the worker's environment, it pins that job's interval at every worker start.
NODE_SWEEP_INTERVAL = NumberSetting("MESHNET_NODE_SWEEP_INTERVAL", 10.0, minimum=0.5)
ROUTE_PRUNE_INTERVAL = NumberSetting("MESHNET_ROUTE_PRUNE_INTERVAL", 3600.0, minimum=1.0)
ROUTE_PROBE_INTERVAL = NumberSetting("MESHNET_ROUTE_PROBE_INTERVAL", 300.0, minimum=1.0)
ROUTE_REPROBE_INTERVAL = NumberSetting("MESHNET_ROUTE_REPROBE_INTERVAL", 60.0, minimum=1.0)
AUDIT_INTERVAL = NumberSetting("MESHNET_AUDIT_INTERVAL", 3600.0, minimum=1.0)
NODE_REPROOF_INTERVAL = NumberSetting("MESHNET_NODE_REPROOF_INTERVAL", 300.0, minimum=1.0)
NODE_PRUNE_INTERVAL = NumberSetting("MESHNET_NODE_PRUNE_INTERVAL", 3600.0, minimum=1.0)

# The node registry's trust rules (ADR-0008): how long an offline node's row
# is kept, and the most tokens/s a node may claim at registration.
NODE_RETENTION = NumberSetting("MESHNET_NODE_RETENTION", 7 * 24 * 3600.0, minimum=60.0)
NODE_MAX_BENCHMARK_TPS = NumberSetting(
    "MESHNET_NODE_MAX_BENCHMARK_TPS", 1e6, minimum=0.0, exclusive_minimum=True
)
ABANDONED_SWEEP_INTERVAL = NumberSetting("MESHNET_ABANDONED_SWEEP_INTERVAL", 600.0, minimum=1.0)
GUARDS_PRUNE_INTERVAL = NumberSetting("MESHNET_GUARDS_PRUNE_INTERVAL", 600.0, minimum=1.0)

# What the billing audit looks at and flags (ADR-0007).
AUDIT_WINDOW = NumberSetting("MESHNET_AUDIT_WINDOW", 24 * 3600.0, minimum=60.0)
AUDIT_SHORT_COMPLETION_TOKENS = NumberSetting(
    "MESHNET_AUDIT_SHORT_COMPLETION_TOKENS", 4, minimum=1, integer=True
)

# The probe's sample of served requests (ADR-0007): how many a model keeps, how long,
# and how many each probe run re-runs.
PROBE_SAMPLE_SIZE = NumberSetting("MESHNET_PROBE_SAMPLE_SIZE", 32, minimum=0, integer=True)
PROBE_SAMPLE_MAX_AGE = NumberSetting("MESHNET_PROBE_SAMPLE_MAX_AGE", 3600.0, minimum=1.0)
PROBE_SAMPLE_CHECKS = NumberSetting("MESHNET_PROBE_SAMPLE_CHECKS", 2, minimum=0, integer=True)


@dataclass(frozen=True)
class BeatJob:
    """One periodic job: its schedule entry's name, the Celery task, its interval setting."""

    name: str
    task: str
    interval: NumberSetting
    kwargs: Mapping[str, Any] | None = None

    def seconds(self, env: Mapping[str, str]) -> int:
        """The interval in whole seconds (the database schedule counts whole seconds)."""
        return max(1, math.ceil(self.interval.read(env)))


# The database's schedule rows come from frozen migrations (tracker_app 0005,
# guards 0002, nodes_app 0004), not from this list: a job added here needs a new migration
# that creates its row.
BEAT_JOBS: tuple[BeatJob, ...] = (
    BeatJob("nodes-sweep-stale", "nodes.sweep_stale", NODE_SWEEP_INTERVAL),
    BeatJob("requests-fail-abandoned", "requests.fail_abandoned", ABANDONED_SWEEP_INTERVAL),
    BeatJob("routing-prune-arms", "routing.prune_arms", ROUTE_PRUNE_INTERVAL),
    BeatJob("routing-probe-routes", "routing.probe_routes", ROUTE_PROBE_INTERVAL),
    BeatJob(
        "routing-reprobe-quarantined",
        "routing.probe_routes",
        ROUTE_REPROBE_INTERVAL,
        kwargs={"due_only": True},
    ),
    BeatJob("billing-audit", "billing.audit", AUDIT_INTERVAL),
    BeatJob("guards-prune", "guards.prune", GUARDS_PRUNE_INTERVAL),
    BeatJob("nodes-reprove-endpoints", "nodes.reprove_endpoints", NODE_REPROOF_INTERVAL),
    BeatJob("nodes-prune-stale", "nodes.prune_stale", NODE_PRUNE_INTERVAL),
)


def beat_schedule_pins(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The schedule entries whose interval the environment sets explicitly.

    django-celery-beat writes these over the database's rows when the worker
    starts, so an interval set in the environment wins; every other job keeps
    the interval an operator gave it in the admin (or the migration's default).
    """
    pins: dict[str, dict[str, Any]] = {}
    for job in BEAT_JOBS:
        if env.get(job.interval.name, "").strip():
            entry: dict[str, Any] = {"task": job.task, "schedule": float(job.seconds(env))}
            if job.kwargs:
                entry["kwargs"] = dict(job.kwargs)
            pins[job.name] = entry
    return pins


def tracker_id(env: Mapping[str, str]) -> str:
    """MESHNET_TRACKER_ID: names this tracker's durable route statistics ("" = derive).

    Empty means ``runtracker`` derives it from the host name and its port, which
    stays the same across restarts of the same tracker.
    """
    value = env.get("MESHNET_TRACKER_ID", "").strip()
    if len(value) > 100:
        raise ImproperlyConfigured("MESHNET_TRACKER_ID must be at most 100 characters")
    return value


def metrics_token(env: Mapping[str, str]) -> str:
    """MESHNET_METRICS_TOKEN: the Bearer token ``/metrics`` asks for ("" = none).

    Without one, ``/metrics`` answers loopback and private addresses only.
    A token of a few characters would be guessed: at least 16 are required.
    """
    value = env.get("MESHNET_METRICS_TOKEN", "").strip()
    if value and len(value) < 16:
        raise ImproperlyConfigured("MESHNET_METRICS_TOKEN must be at least 16 characters")
    return value
