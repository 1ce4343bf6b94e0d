"""Serve the tracker (HTTP and websockets) under daphne."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from daphne.endpoints import build_endpoint_description_strings
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

from meshnet_site.asgi_limits import BoundedServer
from meshnet_site.environment import (
    ROUTE_EXPLORE_SHARE,
    ROUTE_LOAD_EXPONENT,
    ROUTE_MAX_UNSAMPLED,
    ROUTE_POLICY,
    ROUTE_STATS_HALF_LIFE,
    ROUTE_WEIGHT_ALPHA,
    ChoiceSetting,
    NumberSetting,
)

# Connections the kernel may hold for the tracker before it accepts them. Twisted's
# default is 50: a burst of new clients beyond it overflows the queue, and under
# SYN cookies a few of them are reset unanswered (200 chats at once lost 4 so).
# 2048 as uvicorn and gunicorn default to; the kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 2048

# flag dest -> the setting it overrides (whose range it must respect)
ROUTE_FLAGS: dict[str, NumberSetting | ChoiceSetting] = {
    "route_policy": ROUTE_POLICY,
    "route_explore_share": ROUTE_EXPLORE_SHARE,
    "route_weight_alpha": ROUTE_WEIGHT_ALPHA,
    "route_stats_half_life": ROUTE_STATS_HALF_LIFE,
    "route_max_unsampled": ROUTE_MAX_UNSAMPLED,
    "route_load_exponent": ROUTE_LOAD_EXPONENT,
}


class Command(BaseCommand):
    help = "Serve the Meshnet tracker (API, admin, dashboard, websockets) under daphne."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--host",
            default="127.0.0.1",
            help="address to listen on (0.0.0.0: every interface); default 127.0.0.1",
        )
        parser.add_argument("--port", type=int, default=8000, help="default 8000")
        parser.add_argument(
            "--route-policy",
            choices=ROUTE_POLICY.choices,
            default=None,
            help="overrides MESHNET_ROUTE_POLICY (ADR-0011)",
        )
        parser.add_argument(
            "--route-explore-share",
            type=float,
            default=None,
            help="overrides MESHNET_ROUTE_EXPLORE_SHARE (0-1)",
        )
        parser.add_argument(
            "--route-weight-alpha",
            type=float,
            default=None,
            help="overrides MESHNET_ROUTE_WEIGHT_ALPHA (> 0)",
        )
        parser.add_argument(
            "--route-stats-half-life",
            type=float,
            default=None,
            help="overrides MESHNET_ROUTE_STATS_HALF_LIFE (seconds, > 0)",
        )
        parser.add_argument(
            "--route-max-unsampled",
            type=float,
            default=None,
            help="overrides MESHNET_ROUTE_MAX_UNSAMPLED (seconds, >= 1; thompson-load)",
        )
        parser.add_argument(
            "--route-load-exponent",
            type=float,
            default=None,
            help="overrides MESHNET_ROUTE_LOAD_EXPONENT (0-4; thompson-load)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.apply_route_overrides(options)
        if not settings.MESHNET_TRACKER_ID:
            # Stable across restarts of this tracker, distinct between trackers.
            settings.MESHNET_TRACKER_ID = f"{socket.gethostname()}:{options['port']}"
        self.check_migrated()
        from meshnet_site.asgi import application

        endpoints = [
            f"{endpoint}:backlog={LISTEN_BACKLOG}"
            for endpoint in build_endpoint_description_strings(
                host=options["host"], port=options["port"]
            )
        ]
        base = f"http://{options['host']}:{options['port']}"
        ready_line = (
            f"Meshnet tracker ready: dashboard {base}/dashboard/  API {base}/v1/  "
            f"admin {base}/admin/  (route policy {settings.MESHNET_ROUTE_POLICY}, "
            f"explore share {settings.MESHNET_ROUTE_EXPLORE_SHARE}, "
            f"alpha {settings.MESHNET_ROUTE_WEIGHT_ALPHA}, "
            f"half-life {settings.MESHNET_ROUTE_STATS_HALF_LIFE} s)"
        )
        # Daphne calls this once its sockets listen, just before it serves.
        BoundedServer(
            application=application,
            endpoints=endpoints,
            verbosity=0,
            ready_callable=lambda: self.start_background(ready_line),
            max_body_bytes=settings.MESHNET_MAX_REQUEST_BYTES,
        ).run()

    def start_background(self, ready_line: str) -> None:
        """Before serving: restore the learned routes, relay the workers' events, say so."""
        from routing_app.tracker_store import route_stats_store
        from tracker_app.dashboard.outbox_relay import outbox_relay_start

        route_stats_store()
        outbox_relay_start(asyncio.get_event_loop())
        self.stdout.write(ready_line)

    def check_migrated(self) -> None:
        """Refuse to serve a database the code's models do not match yet."""
        executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        connections.close_all()  # the server opens its own, per thread
        if pending:
            names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in pending[:5])
            raise CommandError(
                f"the database lacks {len(pending)} migration(s) ({names}…); "
                "run `manage.py migrate` (or `make setup`) first"
            )

    def apply_route_overrides(self, options: dict[str, Any]) -> None:
        """Validate the routing flags like their env vars, then let them win."""
        for dest, setting in ROUTE_FLAGS.items():
            value = options.get(dest)
            if value is None:
                continue
            flag = "--" + dest.replace("_", "-")
            try:
                setting.check(value, label=flag)
            except ImproperlyConfigured as exc:
                raise CommandError(str(exc)) from None
            setattr(settings, setting.name, value)
