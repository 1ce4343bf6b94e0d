"""Serve the tracker (HTTP and websockets) under daphne: one process, or N behind one port.

``--processes N`` (ADR-0023) binds the port (a socket per process, with
``SO_REUSEPORT``) and runs N daphne processes on it, supervised by this one
(``meshnet_site.server_processes``); each is started again as this command
with ``--serve-fd``, the listening socket it inherits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
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
from meshnet_site.server_processes import Listener, ServerProcesses, lifeline_hold

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

# MESHNET_TRACKER_ID's longest value (meshnet_site.environment.tracker_id).
TRACKER_ID_MAX = 100


def process_count(value: str) -> int:
    """``--processes``: a count of at least 1, or ``auto`` (the CPUs this process may use)."""
    if value == "auto":
        return len(os.sched_getaffinity(0))
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a count nor auto") from None
    if count < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return count


def process_tracker_id(base: str, index: int) -> str:
    """The tracker id of server process ``index`` (1…N) of the tracker named ``base``.

    Process 1 keeps the tracker's own name, so a tracker that goes from one
    process to several (or back) keeps what its first process learned; each
    other process has a durable copy and a Redis publication of its own
    (two writers under one name would overwrite each other's).
    """
    return base if index == 1 else f"{base}/{index}"


def shared_state_problem(count: int) -> str | None:
    """Why ``count`` processes cannot serve as one tracker with these settings, or None."""
    if count == 1:
        return None
    if not getattr(settings, "REDIS_URL", None):
        return (
            f"--processes {count} needs REDIS_URL: without Redis each process keeps its own "
            "websocket groups (a dashboard would see only the chats of the process it reached) "
            "and its own route statistics, so the port would be "
            f"{count} trackers that disagree. Set REDIS_URL, or run one process."
        )
    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        return (
            f"--processes {count} needs PostgreSQL (DATABASE_URL): SQLite lets one process "
            "write at a time, so the processes would queue for its lock on every chat. "
            "Set DATABASE_URL, or run one process."
        )
    return None


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
            "--processes",
            type=process_count,
            default=1,
            help="server processes behind the one port (auto: one per CPU); more than 1 "
            "needs REDIS_URL and PostgreSQL (ADR-0023). Default 1",
        )
        # A server process the supervisor started: the descriptors it inherits.
        for hidden in ("--serve-fd", "--lifeline-fd", "--process-index"):
            parser.add_argument(hidden, type=int, default=None, help=argparse.SUPPRESS)
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
        count: int = options["processes"]
        if options["serve_fd"] is not None:
            self.serve_process(options)
            return
        problem = shared_state_problem(count)
        if problem is not None:
            raise CommandError(problem)
        if not settings.MESHNET_TRACKER_ID:
            # Stable across restarts of this tracker, distinct between trackers.
            settings.MESHNET_TRACKER_ID = f"{socket.gethostname()}:{options['port']}"
        if len(process_tracker_id(settings.MESHNET_TRACKER_ID, count)) > TRACKER_ID_MAX:
            raise CommandError(
                f"MESHNET_TRACKER_ID is too long for {count} processes: at most "
                f"{TRACKER_ID_MAX - len(f'/{count}')} characters"
            )
        self.check_migrated()
        if count > 1:
            self.supervise(options, count)
            return
        from meshnet_site.asgi import application

        endpoints = [
            f"{endpoint}:backlog={LISTEN_BACKLOG}"
            for endpoint in build_endpoint_description_strings(
                host=options["host"], port=options["port"]
            )
        ]
        ready_line = self.ready_line(options["host"], options["port"], "")
        # Daphne calls this once its sockets listen, just before it serves.
        BoundedServer(
            application=application,
            endpoints=endpoints,
            verbosity=0,
            ready_callable=lambda: self.start_background(ready_line),
            max_body_bytes=settings.MESHNET_MAX_REQUEST_BYTES,
        ).run()

    def ready_line(self, host: str, port: int, processes: str) -> str:
        base = f"http://{host}:{port}"
        return (
            f"Meshnet tracker ready: dashboard {base}/dashboard/  API {base}/v1/  "
            f"admin {base}/admin/  ({processes}route policy {settings.MESHNET_ROUTE_POLICY}, "
            f"explore share {settings.MESHNET_ROUTE_EXPLORE_SHARE}, "
            f"alpha {settings.MESHNET_ROUTE_WEIGHT_ALPHA}, "
            f"half-life {settings.MESHNET_ROUTE_STATS_HALF_LIFE} s)"
        )

    def supervise(self, options: dict[str, Any], count: int) -> None:
        """Bind the port once, run ``count`` server processes on it until told to stop."""
        try:
            listeners = Listener.bind_group(
                options["host"], options["port"], count, backlog=LISTEN_BACKLOG
            )
        except OSError as error:
            hint = " (--processes serves IPv4 addresses only)" * isinstance(error, socket.gaierror)
            raise CommandError(
                f"cannot listen on {options['host']}:{options['port']}{hint}: {error}"
            ) from None
        port = listeners[0].port
        base_id = settings.MESHNET_TRACKER_ID
        flags = [
            f"--{dest.replace('_', '-')}={options[dest]}"
            for dest in ROUTE_FLAGS
            if options.get(dest) is not None
        ]

        def command_line(index: int, serve_fd: int, lifeline_fd: int) -> list[str]:
            return [
                sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "runtracker",
                "--host", options["host"], "--port", str(port), *flags,
                "--processes", str(count), "--process-index", str(index),
                "--serve-fd", str(serve_fd), "--lifeline-fd", str(lifeline_fd),
            ]  # fmt: skip

        # /metrics from any process counts every process's requests (prometheus_client's
        # multiprocess mode): a directory the processes share, this run's own.
        metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(
            prefix="meshnet-metrics-"
        )

        def env(index: int) -> dict[str, str]:
            return {
                **os.environ,
                "MESHNET_TRACKER_ID": process_tracker_id(base_id, index),
                "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
            }

        def ended(pid: int) -> None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid, metrics_dir)

        def ready(pids: list[int]) -> None:
            listed = ", ".join(str(pid) for pid in pids)
            processes = f"{count} processes, pids {listed}; "
            self.stdout.write(self.ready_line(options["host"], port, processes))
            self.stdout.flush()

        supervisor = ServerProcesses(
            listeners=listeners,
            on_exit=ended,
            command_line=command_line,
            env=env,
            say=lambda line: self.stderr.write(line, style_func=str),
        )
        try:
            status = supervisor.run(ready)
        finally:
            for listener in listeners:
                listener.close()
            if metrics_dir != os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                shutil.rmtree(metrics_dir, ignore_errors=True)
        if status:
            raise SystemExit(status)

    def serve_process(self, options: dict[str, Any]) -> None:
        """One of ``--processes`` N server processes: serve the inherited socket."""
        from meshnet_site.asgi import application

        index, count = options["process_index"], options["processes"]
        endpoint = Listener.endpoint(options["serve_fd"])
        server = BoundedServer(
            application=application,
            endpoints=[endpoint],
            verbosity=0,
            max_body_bytes=settings.MESHNET_MAX_REQUEST_BYTES,
            process_label=f"{index}/{count}",
        )
        server.ready_callable = lambda: self.start_process_background(server, options)
        server.run()

    def start_process_background(self, server: BoundedServer, options: dict[str, Any]) -> None:
        """A server process's start: as one tracker's, then tell the supervisor it serves;
        it stops (as on SIGTERM) when the supervisor is gone."""
        self.start_background(None)
        lifeline_hold(asyncio.get_event_loop(), options["lifeline_fd"], server.stop)

    def start_background(self, ready_line: str | None) -> None:
        """Before serving: restore the learned routes, relay the workers' events, say so."""
        from routing_app.learning.tracker_store import route_stats_store
        from tracker_app.dashboard.outbox_relay import outbox_relay_start

        route_stats_store()
        outbox_relay_start(asyncio.get_event_loop())
        if ready_line is not None:
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
