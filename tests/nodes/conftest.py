"""Fixtures for node tests: real node processes (and a real tracker) on free ports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes_app.runtime import wire
from nodes_app.runtime.sampling import SamplingParams
from tests.conftest import (
    ROOT,
    free_port,
    fresh_process_database,
    process_env,
    query_process_database,
    wait_for_port,
)

TINY = "tiny-random-llama"
SMOLLM2 = "smollm2-135m"
HIDDEN = 64  # the tiny model's hidden size


def forward_headers(
    session: str,
    rows: int,
    *,
    start: int = 2,
    end: int = 3,
    position: int = 0,
    dtype: str = "float32",
    shape: str | None = None,
) -> dict[str, str]:
    headers = wire.step_headers(
        session_id=session,
        start=start,
        end=end,
        position=position,
        dtype=dtype,
        shape=(1, rows, HIDDEN),
        sampling=SamplingParams() if end == 3 else None,
    )
    if shape is not None:
        headers[wire.SHAPE] = shape
    return headers


def node_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class NodeProcess:
    """A node started as its own process; ``log`` is everything it printed."""

    port: int
    node_id: str
    layers: tuple[int, int]
    process: subprocess.Popen[bytes]
    log_path: Path
    endpoint: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.endpoint = f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " serving " in self.log:
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"node exited with {self.process.returncode}:\n{self.log}")
            time.sleep(0.1)
        raise TimeoutError(f"node on {self.port} not serving after {timeout} s:\n{self.log}")

    def health(self) -> dict[str, Any]:
        return httpx.get(f"{self.endpoint}/v1/health", timeout=10).json()

    def hop(self, start: int | None = None, end: int | None = None) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "endpoint": self.endpoint,
            "start_layer": self.layers[0] if start is None else start,
            "end_layer": self.layers[1] if end is None else end,
        }

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_node(
    tmp: Path,
    model: str,
    layers: tuple[int, int],
    *,
    node_id: str,
    extra_args: list[str] | None = None,
) -> NodeProcess:
    """``python -m nodes_app.runtime`` (no tracker), one torch thread."""
    port = free_port()
    log_path = tmp / f"node-{node_id}-{port}.log"
    args = [
        sys.executable, "-m", "nodes_app.runtime", "--model", model,
        "--layers", f"{layers[0]}-{layers[1]}", "--port", str(port),
        "--threads", "1", "--node-id", node_id, *(extra_args or []),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            args, cwd=ROOT, env=node_env(), stdout=log, stderr=subprocess.STDOUT
        )
    return NodeProcess(port, node_id, layers, process, log_path)


def generate_body(
    nodes_and_ranges: list[tuple[NodeProcess, int, int]],
    *,
    model: str = TINY,
    content: str = "Hello there",
    max_tokens: int = 16,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "request_id": f"req-{time.monotonic_ns()}",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "plan": {
            "model": model,
            "hops": [node.hop(start, end) for node, start, end in nodes_and_ranges],
        },
        **extra,
    }


def read_stream(endpoint: str, body: dict[str, Any], timeout: float = 120.0) -> list[Any]:
    """Every SSE ``data:`` payload of a ``/v1/generate`` call, parsed ("[DONE]" kept as is)."""
    frames: list[Any] = []
    with httpx.stream("POST", f"{endpoint}/v1/generate", json=body, timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                frames.append(payload if payload == "[DONE]" else json.loads(payload))
    return frames


def completion(frames: list[Any]) -> tuple[str, list[int], dict[str, Any]]:
    """(text, token ids, last chunk) of a finished stream."""
    chunks = [f for f in frames if isinstance(f, dict) and "choices" in f]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    ids = [i for c in chunks for i in c.get("meshnet_token_ids", [])]
    return text, ids, chunks[-1]


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


@contextlib.contextmanager
def running_nodes(
    tmp: Path, model: str, layouts: dict[str, tuple[int, int]], *, prefix: str, timeout: float
) -> Iterator[dict[str, NodeProcess]]:
    """Start one node per named layer range, wait until all serve, stop them all after."""
    nodes = {
        name: start_node(tmp, model, layers, node_id=f"{prefix}-{name}")
        for name, layers in layouts.items()
    }
    try:
        for node in nodes.values():
            node.wait_serving(timeout=timeout)
        yield nodes
    finally:
        for node in nodes.values():
            node.stop()


# head + tail, the whole model, and a partial head (ADR-0020's topology).
LAYOUTS = {"head": (0, 1), "tail": (2, 3), "whole": (0, 3), "partial": (0, 2)}


@pytest.fixture(scope="module")
def tiny_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, NodeProcess]]:
    """Tiny-model nodes: head 0-1, tail 2-3, whole 0-3, and a partial head 0-2."""
    tmp = tmp_path_factory.mktemp("tiny-nodes")
    with running_nodes(tmp, TINY, LAYOUTS, prefix="tiny", timeout=120) as nodes:
        yield nodes


@dataclass
class Tracker:
    url: str
    database_url: str
    process: subprocess.Popen[bytes]

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows the tracker wrote (``%s`` placeholders, SQLite or PostgreSQL)."""
        return query_process_database(self.database_url, sql, *params)


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tracker]:
    """A real tracker process on a database of its own, heartbeats every 0.3 s."""
    tmp = tmp_path_factory.mktemp("tracker")
    with fresh_process_database() as database_url:
        env = node_env(
            **process_env(database_url),
            MESHNET_NODE_HEARTBEAT_INTERVAL="0.3",
        )
        port = free_port()
        command = [
            sys.executable, "manage.py", "runtracker", "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
        with (tmp / "tracker.log").open("wb") as log:
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
        try:
            wait_for_port("127.0.0.1", port, timeout=60)
            yield Tracker(f"http://127.0.0.1:{port}", database_url, process)
        finally:
            process.terminate()
            process.wait(timeout=20)
