"""Trackers, workers and whole networks under test, built on the harness (tracker_app.localnet)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.plans import signed, tracker_key
from tests.support.sse import iter_sse, read_sse, text_of
from tracker_app.localnet import (
    LocalNetwork,
    ManagedProcess,
    NodeProcess,
    fresh_process_database,
    process_env,
    query_process_database,
    start_tracker,
    wait_until,
)
from tracker_app.localnet import start_worker as start_localnet_worker


@dataclass
class Tracker:
    """A real ``runtracker`` at ``url`` over ``database_url``, signing plans with the key
    in ``key_file``."""

    url: str
    database_url: str
    process: ManagedProcess
    key_file: Path

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows the tracker wrote (``%s`` placeholders, SQLite or PostgreSQL)."""
        return query_process_database(self.database_url, sql, *params)


@contextlib.contextmanager
def running_tracker(database_url: str, log_dir: Path, **settings: str | None) -> Iterator[Tracker]:
    """A tracker on a free port over ``database_url`` (``settings`` as env, None removes a
    variable), stopped after.

    Its plan-signing key is a file of its own in ``log_dir``.
    """
    key_path = settings.setdefault("MESHNET_TRACKER_KEY_FILE", str(log_dir / "tracker_key"))
    assert key_path is not None, "MESHNET_TRACKER_KEY_FILE=None: the tracker needs a key file"
    key_file = Path(key_path)
    started = start_tracker(env=process_env(database_url, **settings), log_dir=log_dir)
    with started.process:
        started.wait_healthy()
        yield Tracker(started.url, database_url, started.process, key_file)


def start_worker(env: dict[str, str], log_dir: Path) -> ManagedProcess:
    """A real Celery worker and beat in one process (solo pool), its log in ``log_dir``."""
    return start_localnet_worker(env=env, log_dir=log_dir, extra=("--pool", "solo"))


class Network(LocalNetwork):
    """A throwaway network with a client API key, and the chat calls tests make."""

    api_key = ""

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows the tracker wrote (``%s`` placeholders, SQLite or PostgreSQL)."""
        assert self.database_url is not None
        return query_process_database(self.database_url, sql, *params)

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.api_key}"}

    def routes(self, model: str) -> list[dict[str, Any]]:
        """The model's rows of ``/v1/routing`` (candidates, their status) as a client sees them."""
        response = httpx.get(
            f"{self.url}/v1/routing", params={"model": model}, headers=self.headers(), timeout=30
        )
        assert response.status_code == 200, response.text
        return list(response.json()["models"][0]["routes"])

    def chat(self, **body: Any) -> httpx.Response:
        return httpx.post(
            f"{self.url}/v1/chat/completions", json=body, headers=self.headers(), timeout=180
        )

    def stream(self, **body: Any) -> list[Any]:
        """Every SSE payload of a streamed chat ("[DONE]" kept as the string)."""
        return read_sse(
            f"{self.url}/v1/chat/completions", {**body, "stream": True}, headers=self.headers()
        )

    def iter_stream(self, **body: Any) -> Iterator[Any]:
        """The payloads of a streamed chat as they arrive (see :func:`iter_sse`)."""
        return iter_sse(
            f"{self.url}/v1/chat/completions", {**body, "stream": True}, headers=self.headers()
        )


def start_network(database_url: str, tmp: Path, **settings: str | None) -> Iterator[Network]:
    """A tracker (with ``settings`` as MESHNET_* env, None removes a variable) and an API
    key; add nodes after."""
    with Network.throwaway(workdir=tmp, database_url=database_url, env=settings) as network:
        # The key is made over the database while the tracker starts: two
        # process starts overlap.
        with ThreadPoolExecutor(1) as pool:
            api_key = pool.submit(network.create_api_key, "e2e")
            network.start_tracker()
            network.api_key = api_key.result()
        yield network


def redundant_tiny_network(tmp: Path) -> Iterator[Network]:
    """A tracker on a fresh database with two routes for the tiny model: head 0-1 ->
    tail 2-3, and a whole node 0-3 (so a request can fail over from either)."""
    with fresh_process_database() as database_url:
        for network in start_network(database_url, tmp):
            network.add_node("head", "tiny-random-llama", (0, 1), wait=False)
            network.add_node("tail", "tiny-random-llama", (2, 3), wait=False)
            network.add_node("whole", "tiny-random-llama", (0, 3), wait=False)
            network.wait_for_nodes()
            yield network


def head_frames(
    network: LocalNetwork, head: NodeProcess, hops: list[dict[str, Any]], **body: Any
) -> list[Any]:
    """Every SSE payload of the head node's own answer for a plan signed with the
    network's tracker key, straight from ``/v1/generate``."""
    payload = {
        "request_id": f"direct-{time.monotonic_ns()}",
        "plan": {"model": body.pop("model"), "hops": hops},
        **body,
    }
    payload = signed(payload, tracker_key(network.tracker_key_file))
    return read_sse(f"{head.endpoint}/v1/generate", payload)


def head_generate(
    network: LocalNetwork, head: NodeProcess, hops: list[dict[str, Any]], **body: Any
) -> str:
    """The text of the head node's own answer (:func:`head_frames`)."""
    return text_of(head_frames(network, head, hops, **body))


def head_tail_answer(network: LocalNetwork, messages: list[dict[str, Any]], max_tokens: int) -> str:
    """The greedy answer of the network's ``head`` node over its real ``tail``, the
    tracker bypassed: what a chat routed head → tail must equal."""
    head, tail = network.nodes["head"], network.nodes["tail"]
    return head_generate(
        network,
        head,
        [head.hop(), tail.hop()],
        model="tiny-random-llama",
        messages=messages,
        max_tokens=max_tokens,
        temperature=0.0,
    )


def billed_request(network: Network, answer_id: str) -> tuple[str, str]:
    """The API and status recorded for the request whose answer id (``msg_…``, ``resp_…``,
    ``chatcmpl-…``: a prefix and the request's id in hex) is ``answer_id``, once it is billed.

    The request is recorded as its answer ends and billed just after, so this waits.
    """
    request_id = answer_id[-32:]
    query = (
        "SELECT r.api, r.status, b.id FROM tracker_app_chatrequest r "
        "JOIN tracker_app_billingrecord b ON b.request_id = r.id WHERE r.id = %s"
    )
    wait_until(
        lambda: bool(network.query(query, request_id)), timeout=30, what=f"{answer_id} billed"
    )
    [(api, status, _)] = network.query(query, request_id)
    return str(api), str(status)
