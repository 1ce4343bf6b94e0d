"""A local network: one tracker, a worker and nodes on this machine, each a real process.

Throwaway networks (tests, benchmarks) get a fresh SQLite database, a work
directory for logs and wallets, free ports and an environment that needs no
hub and one torch thread. ``meshnet_up`` runs the operator's network: the
configured database, fixed ports from its topology, logs under ``var/``.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from tracker_app.localnet.processes import (
    LOOPBACK,
    STOP_TIMEOUT,
    ManagedProcess,
    free_port,
    manage_argv,
    node_argv,
    run_checked,
    stop_together,
    tracker_argv,
    wait_until,
    worker_argv,
)

# What a throwaway network's processes need on top of this process's
# environment: a fixed secret (the database is shared), no hub downloads, one
# torch thread each (the machine runs many of them).
THROWAWAY_ENV = {
    "DJANGO_SECRET_KEY": "localnet-only-secret-key",
    "HF_HUB_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# The line a node prints once it serves (after registering, when it has a tracker).
_SERVING = re.compile(r"^node (\S+) serving ", re.MULTILINE)


def process_env(database_url: str | None = None, **overrides: str | None) -> dict[str, str]:
    """The environment of a throwaway network's processes.

    This process's environment, :data:`THROWAWAY_ENV`, unbuffered output,
    ``DATABASE_URL`` when given, then ``overrides`` (None removes a variable,
    e.g. ``REDIS_URL`` for the embedded mode).
    """
    env = {**os.environ, **THROWAWAY_ENV, "PYTHONUNBUFFERED": "1"}
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def migrate(database_url: str) -> None:
    """Bring the database at ``database_url`` to the code's migrations."""
    run_checked(manage_argv("migrate", "--noinput", "-v", "0"), env=process_env(database_url))


def fresh_sqlite_database(directory: Path) -> str:
    """A new SQLite database file in ``directory``, migrated; returns its URL."""
    directory.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{directory / 'tracker.sqlite3'}"
    migrate(url)
    return url


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class NodeProcess:
    """A node serving ``layers`` of ``model`` at ``endpoint``.

    ``node_id`` is the id it serves under: given for a node without a
    tracker, the tracker's once :meth:`wait_serving` saw it register.
    """

    name: str
    model: str
    layers: tuple[int, int]
    endpoint: str
    process: ManagedProcess
    node_id: str = ""

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def output(self) -> str:
        return self.process.output()

    def wait_serving(self, timeout: float = 180.0) -> str:
        """Wait until the node serves (and registered, if it has a tracker); its node id.

        Raises ProcessExited with the node's output if it ends first.
        """

        def serving() -> bool:
            found = _SERVING.search(self.process.output())
            if found:
                self.node_id = found.group(1)
            return found is not None

        wait_until(
            serving, timeout=timeout, what=f"node {self.name} to serve", process=self.process
        )
        return self.node_id

    def health(self) -> dict[str, Any]:
        """The node's ``/v1/health`` document."""
        return dict(httpx.get(f"{self.endpoint}/v1/health", timeout=30).json())

    def hop(self, start: int | None = None, end: int | None = None) -> dict[str, Any]:
        """This node as a plan hop, over its own layers unless told others."""
        return {
            "node_id": self.node_id,
            "endpoint": self.endpoint,
            "start_layer": self.layers[0] if start is None else start,
            "end_layer": self.layers[1] if end is None else end,
        }

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (the node deregisters), SIGKILL after ``timeout``; the exit status."""
        return self.process.stop(timeout)

    def kill(self) -> int:
        """End the node at once, as a crash would: it cannot deregister."""
        return self.process.kill()


def start_node(
    *,
    name: str,
    model: str,
    layers: tuple[int, int],
    env: Mapping[str, str],
    log_dir: Path,
    port: int | None = None,
    host: str = LOOPBACK,
    tracker: str | None = None,
    threads: int | None = 1,
    device: str = "cpu",
    wallet_key: Path | None = None,
    node_id: str | None = None,
    dev_open: bool = False,
    extra: Sequence[str] = (),
) -> NodeProcess:
    """Start a node (see :func:`node_argv`) without waiting for it; log ``node-NAME.log``."""
    port = port or free_port(host)
    argv = node_argv(
        model=model, layers=layers, port=port, tracker=tracker, host=host, threads=threads,
        device=device, wallet_key=wallet_key, node_id=node_id, dev_open=dev_open, extra=extra,
    )  # fmt: skip
    process = ManagedProcess(f"node-{name}", argv, env=env, log_path=log_dir / f"node-{name}.log")
    return NodeProcess(name, model, layers, f"http://{host}:{port}", process, node_id or "")


@dataclass
class TrackerProcess:
    """A tracker serving at ``url``."""

    url: str
    process: ManagedProcess

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Wait until ``/healthz`` answers 200 (its database answers too)."""
        wait_until(
            lambda: _answers(f"{self.url}/healthz"),
            timeout=timeout,
            what="the tracker to answer",
            interval=0.2,
            process=self.process,
        )


def start_tracker(
    *,
    env: Mapping[str, str],
    log_dir: Path,
    host: str = LOOPBACK,
    port: int | None = None,
    flags: Sequence[str] = (),
) -> TrackerProcess:
    """Start ``runtracker`` without waiting for it; log ``tracker.log``."""
    port = port or free_port(host)
    process = ManagedProcess(
        "tracker", tracker_argv(host, port, *flags), env=env, log_path=log_dir / "tracker.log"
    )
    return TrackerProcess(f"http://{host}:{port}", process)


def start_worker(
    *, env: Mapping[str, str], log_dir: Path, extra: Sequence[str] = ()
) -> ManagedProcess:
    """Start the Celery worker with embedded beat (see :func:`worker_argv`); log ``worker.log``."""
    return ManagedProcess("worker", worker_argv(*extra), env=env, log_path=log_dir / "worker.log")


class LocalNetwork:
    """One tracker, a worker and nodes as processes; a context manager that stops them.

    Build one with :meth:`throwaway` (tests, benchmarks) or :meth:`operator`
    (``meshnet_up``). Entering creates a throwaway network's database;
    leaving stops the nodes together, then the others newest first (nodes deregister while the
    tracker still runs), each with SIGTERM then SIGKILL.
    """

    def __init__(
        self,
        *,
        env: dict[str, str],
        workdir: Path,
        database_url: str | None,
        is_throwaway: bool,
        say: Callable[[str], None] | None = None,
        host: str = LOOPBACK,
    ) -> None:
        self.env = env
        self.workdir = workdir
        self.database_url = database_url
        self.is_throwaway = is_throwaway
        self.say = say or (lambda message: None)
        self.host = host
        self.tracker: TrackerProcess | None = None
        self.worker: ManagedProcess | None = None
        self.nodes: dict[str, NodeProcess] = {}
        self._processes: list[ManagedProcess] = []

    @classmethod
    def throwaway(
        cls,
        *,
        workdir: Path | None = None,
        database_url: str | None = None,
        env: Mapping[str, str | None] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> Self:
        """A network nobody keeps, on free ports.

        Logs, wallets and the state folder (MESHNET_VAR_DIR) go to ``workdir`` (a new temporary
        directory when None, left behind for its logs); the database is a
        fresh SQLite file there unless ``database_url`` (already migrated) is
        given; the environment is :func:`process_env` with ``env`` as overrides.
        """
        workdir = workdir or Path(tempfile.mkdtemp(prefix="meshnet-localnet-"))
        # Its own state folder: broker queues, secret key and tracker signing
        # key shared with no other network (nor with the operator's var/).
        overrides = {
            "MESHNET_VAR_DIR": str(workdir / "var"),
            "MESHNET_TRACKER_KEY_FILE": str(workdir / "var" / "tracker_key"),
            **(env or {}),
        }
        return cls(
            env=process_env(database_url, **overrides),
            workdir=workdir,
            database_url=database_url,
            is_throwaway=True,
            say=say,
        )

    @classmethod
    def operator(cls, *, log_dir: Path, say: Callable[[str], None], host: str = LOOPBACK) -> Self:
        """The operator's network on ``host``: this process's environment and database,
        runnode's default wallets (nodes keep their ids across runs), logs in ``log_dir``."""
        return cls(
            host=host,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            workdir=log_dir,
            database_url=None,
            is_throwaway=False,
            say=say,
        )

    @property
    def tracker_key_file(self) -> Path | None:
        """The tracker's plan-signing key file when this network names one (throwaway
        networks do), so that a test or benchmark can sign the plans it sends a head."""
        value = self.env.get("MESHNET_TRACKER_KEY_FILE")
        return Path(value) if value else None

    @property
    def url(self) -> str:
        """The tracker's base URL; raises RuntimeError before :meth:`start_tracker`."""
        if self.tracker is None:
            raise RuntimeError("the network has no tracker yet")
        return self.tracker.url

    def __enter__(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.is_throwaway and self.database_url is None:
            self.database_url = fresh_sqlite_database(self.workdir)
            self.env["DATABASE_URL"] = self.database_url
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start_tracker(
        self, *, port: int | None = None, flags: Sequence[str] = (), timeout: float = 60.0
    ) -> str:
        """Start the tracker and wait until it answers; returns its URL."""
        self.tracker = start_tracker(
            env=self.env, log_dir=self.workdir, host=self.host, port=port, flags=flags
        )
        self._started(self.tracker.process)
        self.tracker.wait_healthy(timeout)
        return self.tracker.url

    def start_worker(self, *extra: str) -> ManagedProcess:
        """Start the Celery worker with its beat (``extra`` are its flags); the schedule
        is in the network's database (django-celery-beat)."""
        self.worker = start_worker(env=self.env, log_dir=self.workdir, extra=extra)
        self._started(self.worker)
        return self.worker

    def add_node(
        self,
        name: str,
        model: str,
        layers: tuple[int, int],
        *,
        port: int | None = None,
        threads: int | None = 1,
        device: str = "cpu",
        extra: Sequence[str] = (),
        wait: bool = True,
        timeout: float = 180.0,
    ) -> NodeProcess:
        """Start ``runnode`` joined to this network's tracker; with ``wait``, return once
        it registered and serves (else see :meth:`wait_for_nodes`)."""
        wallet = self.workdir / "wallets" / f"wallet-{name}.key" if self.is_throwaway else None
        node = start_node(
            name=name, model=model, layers=layers, env=self.env, log_dir=self.workdir,
            port=port, host=self.host, tracker=self.url, threads=threads, device=device,
            wallet_key=wallet, extra=extra,
        )  # fmt: skip
        self.nodes[name] = node
        self._started(node.process)
        if wait:
            node.wait_serving(timeout)
        return node

    def wait_for_nodes(self, timeout: float = 300.0) -> None:
        """Wait until every node serves; raises ProcessExited or TimeoutError."""
        for node in self.nodes.values():
            node.wait_serving(timeout)

    def wait_for_route(self, model: str, timeout: float = 300.0) -> None:
        """Wait until every node serves and the tracker lists ``model`` in ``/v1/models``
        (a complete route exists); raises ProcessExited or TimeoutError."""
        self.wait_for_nodes(timeout)

        def listed() -> bool:
            try:
                served = httpx.get(f"{self.url}/v1/models", timeout=5).json()["data"]
            except httpx.HTTPError:
                return False
            return any(entry["id"] == model for entry in served)

        process = None if self.tracker is None else self.tracker.process
        wait_until(
            listed, timeout=timeout, what=f"a route for {model}", interval=0.2, process=process
        )

    def create_api_key(self, name: str) -> str:
        """A new client API key (``manage.py create_api_key NAME`` over this database)."""
        out = run_checked(manage_argv("create_api_key", name), env=self.env)
        return out.strip().splitlines()[-1]

    def create_staff_user(self, username: str, password: str) -> None:
        """A superuser for the admin and the dashboard (``manage.py createsuperuser``)."""
        run_checked(
            manage_argv(
                "createsuperuser", "--noinput", "--username", username,
                "--email", f"{username}@localhost",
            ),
            env={**self.env, "DJANGO_SUPERUSER_PASSWORD": password},
        )  # fmt: skip

    def check_alive(self) -> None:
        """Raise ProcessExited, naming its log, if any process of the network has ended."""
        for process in self._processes:
            process.check_alive()

    def stop(self) -> None:
        """Stop the nodes together, then the others newest first; harmless to call again."""
        nodes = {node.process for node in self.nodes.values()}
        stop_together(process for process in self._processes if process in nodes)
        for process in reversed(self._processes):
            process.stop()

    def _started(self, process: ManagedProcess) -> None:
        self._processes.append(process)
        self.say(f"started {process.name} (pid {process.pid}), log {process.log_path}")
