"""A real network for end-to-end tests: a tracker process and `runnode` node processes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import (
    ManagedProcess,
    free_port,
    process_env,
    query_process_database,
    start_manage_command,
    wait_for_port,
)


@dataclass
class NodeHandle:
    name: str
    node_id: str
    endpoint: str
    layers: tuple[int, int]
    managed: ManagedProcess

    def health(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.endpoint}/v1/health", timeout=10).json())

    def hop(self, start: int | None = None, end: int | None = None) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "endpoint": self.endpoint,
            "start_layer": self.layers[0] if start is None else start,
            "end_layer": self.layers[1] if end is None else end,
        }


@dataclass
class Network:
    """Tracker at ``url`` over ``database_url``; nodes by name; a client API key."""

    url: str
    database_url: str
    tmp: Path
    env: dict[str, str]
    tracker: ManagedProcess
    api_key: str = ""
    nodes: dict[str, NodeHandle] = field(default_factory=dict)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return query_process_database(self.database_url, sql, *params)

    def add_node(self, name: str, model: str, layers: tuple[int, int]) -> NodeHandle:
        """Start `runnode` and wait until the tracker lists it online."""
        port = free_port()
        managed = start_manage_command(
            [
                "runnode",
                "--model",
                model,
                "--layers",
                f"{layers[0]}-{layers[1]}",
                "--port",
                str(port),
                "--tracker",
                self.url,
                "--threads",
                "1",
                "--wallet-key",
                str(self.tmp / f"wallet-{name}.key"),
            ],
            self.env,
            self.tmp / f"node-{name}.log",
        )
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            rows = self.query(
                "SELECT id FROM nodes_app_node WHERE endpoint = %s AND status = 'online'",
                endpoint,
            )
            if rows:
                break
            if managed.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"node {name} did not register:\n{managed.output()}")
            time.sleep(0.2)
        node = NodeHandle(name, str(rows[0][0]), endpoint, layers, managed)
        self.nodes[name] = node
        return node

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.api_key}"}

    def chat(self, **body: Any) -> httpx.Response:
        return httpx.post(
            f"{self.url}/v1/chat/completions", json=body, headers=self.headers(), timeout=180
        )

    def stream(self, **body: Any) -> list[Any]:
        """Every SSE payload of a streamed chat ("[DONE]" kept as the string)."""
        frames: list[Any] = []
        with httpx.stream(
            "POST",
            f"{self.url}/v1/chat/completions",
            json={**body, "stream": True},
            headers=self.headers(),
            timeout=180,
        ) as response:
            assert response.status_code == 200, response.read()
            assert response.headers["content-type"].startswith("text/event-stream")
            for line in response.iter_lines():
                if line.startswith("data: "):
                    payload = line.removeprefix("data: ")
                    frames.append(payload if payload == "[DONE]" else json.loads(payload))
        return frames

    def stop(self) -> None:
        for node in self.nodes.values():
            node.managed.stop()
        self.tracker.stop()


def create_api_key(env: dict[str, str], name: str) -> str:
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "create_api_key", name],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip().splitlines()[-1]


def start_network(database_url: str, tmp: Path, **settings: str) -> Iterator[Network]:
    """A tracker (with ``settings`` as MESHNET_* env) and an API key; add nodes after."""
    env = process_env(database_url, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **settings)
    port = free_port()
    tracker = start_manage_command(
        ["runtracker", "--host", "127.0.0.1", "--port", str(port)], env, tmp / "tracker.log"
    )
    network = Network(f"http://127.0.0.1:{port}", database_url, tmp, env, tracker)
    try:
        wait_for_port("127.0.0.1", port, timeout=60)
        network.api_key = create_api_key(env, "e2e")
        yield network
    finally:
        network.stop()


def chunks_of(frames: list[Any]) -> list[dict[str, Any]]:
    return [f for f in frames if isinstance(f, dict) and "choices" in f]


def text_of(frames: list[Any]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks_of(frames))


def head_generate(head: NodeHandle, hops: list[dict[str, Any]], **body: Any) -> str:
    """The head node's own answer for a plan, straight from `/v1/generate`."""
    payload = {
        "request_id": f"direct-{time.monotonic_ns()}",
        "plan": {"model": body.pop("model"), "hops": hops},
        **body,
    }
    text = ""
    with httpx.stream(
        "POST", f"{head.endpoint}/v1/generate", json=payload, timeout=180
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            data = line.removeprefix("data: ")
            if line.startswith("data: ") and data != "[DONE]":
                frame = json.loads(data)
                text += frame["choices"][0]["delta"].get("content") or ""
    return text
