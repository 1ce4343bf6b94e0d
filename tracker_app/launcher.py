"""Start a whole Meshnet network on this machine: tracker, worker and nodes.

This is what `make demo` (via `manage.py meshnet_up`) runs. Each part is a
real process started with its public command, so the demo exercises exactly
what an operator would run by hand.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_TOPOLOGY: dict[str, Any] = {
    "tracker": {"host": "127.0.0.1", "port": 8000},
    "nodes": [
        {"model": "smollm2-135m", "layers": "0-14", "port": 7001, "threads": 1},
        {"model": "smollm2-135m", "layers": "15-29", "port": 7002, "threads": 1},
    ],
}


class TopologyError(ValueError):
    pass


@dataclass(frozen=True)
class NodeSpec:
    model: str
    layers: str
    port: int
    threads: int = 1
    device: str = "cpu"


@dataclass(frozen=True)
class Topology:
    host: str
    port: int
    nodes: list[NodeSpec] = field(default_factory=list)

    @property
    def tracker_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def node_endpoints(self) -> list[str]:
        return [f"http://{self.host}:{node.port}" for node in self.nodes]


def topology_load(path: Path | None) -> Topology:
    """Parse a topology JSON file (the default demo topology when ``path`` is None)."""
    raw: Any = DEFAULT_TOPOLOGY
    if path is not None:
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise TopologyError(f"cannot read topology {path}: {exc}") from None
    try:
        tracker = raw.get("tracker", {})
        nodes = [NodeSpec(**node) for node in raw.get("nodes", [])]
        return Topology(
            host=str(tracker.get("host", "127.0.0.1")),
            port=int(tracker.get("port", 8000)),
            nodes=nodes,
        )
    except (AttributeError, TypeError, ValueError) as exc:
        raise TopologyError(f"topology is malformed: {exc}") from None


class Network:
    """The processes of one local network; stops them all, in reverse order."""

    def __init__(self, topology: Topology, *, log_dir: Path, say: Callable[[str], None]) -> None:
        self.topology = topology
        self.log_dir = log_dir
        self.say = say
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._logs: list[IO[bytes]] = []

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        t = self.topology
        self._spawn(
            "tracker",
            ["runtracker", "--host", t.host, "--port", str(t.port)],
        )
        wait_until(lambda: _answers(f"{t.tracker_url}/healthz"), 60, "the tracker to answer")
        self._spawn_raw("worker", worker_argv("--concurrency", "1"))
        for node in t.nodes:
            self._spawn(
                f"node-{node.port}",
                [
                    "runnode",
                    "--model",
                    node.model,
                    "--layers",
                    node.layers,
                    "--port",
                    str(node.port),
                    "--host",
                    t.host,
                    "--tracker",
                    t.tracker_url,
                    "--threads",
                    str(node.threads),
                    "--device",
                    node.device,
                ],
            )

    def wait_for_nodes(self, online: Callable[[], int], timeout: float) -> None:
        expected = len(self.topology.nodes)
        wait_until(lambda: online() >= expected, timeout, f"{expected} node(s) to register")

    def check_alive(self) -> None:
        for name, process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with status {process.returncode}; "
                    f"see {self.log_dir / (name + '.log')}"
                )

    def stop(self) -> None:
        for _, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for _, process in reversed(self.processes):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self._logs:
            log.close()

    def _spawn(self, name: str, command_args: list[str]) -> None:
        self._spawn_raw(name, [sys.executable, str(ROOT / "manage.py"), *command_args])

    def _spawn_raw(self, name: str, argv: list[str]) -> None:
        log = (self.log_dir / f"{name}.log").open("wb")
        self._logs.append(log)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.processes.append((name, process))
        self.say(f"started {name} (pid {process.pid}), log {log.name}")


def worker_argv(*extra: str) -> list[str]:
    """The Celery worker with its beat scheduler embedded, as DESIGN.md starts it."""
    return [
        sys.executable, "-m", "celery", "-A", "meshnet_site", "worker", "-B",
        "--loglevel", "INFO", *extra,
    ]  # fmt: skip


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise TimeoutError(f"gave up waiting {timeout:.0f} s for {what}")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
