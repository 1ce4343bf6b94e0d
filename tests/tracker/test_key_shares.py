"""One API key cannot starve the others: its requests and their reserved KV are bounded.

A real tracker (daphne, a second one over the same database where a test
says so) and a fake head — a real HTTP server registered as a whole-model
tiny node — that admits sessions while their reservations fit its KV budget
(each holds its max_tokens), answers busy beyond it, and streams one token
every 50 ms, so a long answer holds its session as a real route's would.
The attack of the finding: one key's two ``n = 4`` streams of 4,000 tokens
and a filler fill the route, and another key's ordinary chat waits out the
busy deadline. Each key now holds a share of requests and KV tokens in
flight, in leases the database shares between trackers.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes_app.protocol.sse import sse_data
from tests.support.fake_node import SESSION_OVERHEAD, Behaviour, FakeHead
from tests.support.network import Network, running_tracker, start_network
from tracker_app.localnet import fresh_process_database

TINY = "tiny-random-llama"
ONE_WORD = [{"role": "user", "content": "Hello"}]
KEY_KV_SHARE = 20_000
LEASE_SECONDS = 3.0
# Two n = 4 streams of 4,000 tokens fill all but a filler's room.
HEAD_KV_BUDGET = 34_000
SETTINGS = {
    "MESHNET_RATE_LIMIT_PER_MINUTE": "1000",
    "MESHNET_BUSY_DEADLINE": "4",
    "MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT": str(KEY_KV_SHARE),
    "MESHNET_KEY_LEASE_SECONDS": str(LEASE_SECONDS),
}


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    with fresh_process_database() as database_url:
        yield from start_network(database_url, tmp_path_factory.mktemp("shares"), **SETTINGS)


@pytest.fixture(scope="module")
def head(network: Network) -> Iterator[FakeHead]:
    """The route: a head that paces its tokens and has a KV budget."""
    fake = FakeHead(behaviour=Behaviour(gap=0.05), kv_budget=HEAD_KV_BUDGET).start()
    fake.register(network.url, benchmark_tps=100.0)
    network.wait_for_route(TINY)
    yield fake
    fake.stop()


@pytest.fixture
def streams() -> Iterator[Streams]:
    with Streams() as held:
        yield held


class Streams:
    """Streamed chats held open (their clients reading nothing more) until closed."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        # Each held stream's line reader: dropped, it would close its connection.
        self._readers: list[Iterator[str]] = []

    def __enter__(self) -> Streams:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def open(self, url: str, key: str, **body: Any) -> httpx.Response:
        """POST a streamed chat; a 200 is held open once its first token came."""
        client = self._stack.enter_context(httpx.Client(timeout=60))
        response = self._stack.enter_context(
            client.stream(
                "POST",
                f"{url}/v1/chat/completions",
                json={"model": TINY, "messages": ONE_WORD, "stream": True, **body},
                headers={"Authorization": f"Bearer {key}"},
            )
        )
        if response.status_code != 200:
            response.read()
            return response
        lines = response.iter_lines()
        self._readers.append(lines)
        for line in lines:
            payload = sse_data(line)
            assert not (isinstance(payload, dict) and "error" in payload), payload
            if isinstance(payload, dict) and payload["choices"][0]["delta"].get("content"):
                return response
        raise AssertionError("the stream ended before its first token")

    def close(self, response: httpx.Response) -> None:
        response.close()


def chat(url: str, key: str, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": TINY, "messages": ONE_WORD, **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def test_one_keys_streams_cannot_fill_the_route_another_key_needs(
    network: Network, head: FakeHead, streams: Streams
) -> None:
    attacker, victim = network.create_api_key("attacker"), network.create_api_key("victim")
    long = {"n": 4, "max_tokens": 4000}
    filler = HEAD_KV_BUDGET - 2 * 4 * (4000 + SESSION_OVERHEAD) - SESSION_OVERHEAD - 10

    first = streams.open(network.url, attacker, **long)
    second, took = timed(lambda: streams.open(network.url, attacker, **long))
    streams.open(network.url, attacker, max_tokens=filler)
    answer = chat(network.url, victim, max_tokens=8)

    assert first.status_code == 200
    assert second.status_code == 429, second.status_code
    assert error_code(second) == "too_many_kv_tokens_in_flight"
    assert "20000" in second.json()["error"]["message"]
    assert second.headers["Retry-After"] == "1"
    assert took < 2, took  # at once, not after the busy deadline
    assert answer.status_code == 200, answer.text


def test_a_keys_share_is_free_again_once_its_client_leaves(
    network: Network, head: FakeHead, streams: Streams
) -> None:
    key = network.create_api_key("leaves")
    first = streams.open(network.url, key, n=4, max_tokens=4000)
    refused = streams.open(network.url, key, n=4, max_tokens=4000)

    streams.close(first)

    deadline = time.monotonic() + 5
    while (again := streams.open(network.url, key, n=4, max_tokens=4000)).status_code == 429:
        assert time.monotonic() < deadline, again.read()
        time.sleep(0.1)
    assert refused.status_code == 429 and again.status_code == 200


def test_two_trackers_over_one_database_hold_one_share_per_key(
    network: Network, head: FakeHead, streams: Streams, tmp_path: Path
) -> None:
    key = network.create_api_key("two-trackers")
    assert network.database_url is not None
    with running_tracker(
        network.database_url, tmp_path, MESHNET_VAR_DIR=str(tmp_path / "var"), **SETTINGS
    ) as second:
        held = streams.open(network.url, key, n=4, max_tokens=4000)
        elsewhere = streams.open(second.url, key, n=4, max_tokens=4000)
        small = chat(second.url, key, max_tokens=8)
        streams.close(held)

    assert held.status_code == 200
    assert elsewhere.status_code == 429
    assert error_code(elsewhere) == "too_many_kv_tokens_in_flight"
    assert small.status_code == 200, small.text  # within the share: served


def test_a_share_held_by_a_tracker_that_died_is_free_once_its_lease_expires(
    network: Network, head: FakeHead, streams: Streams, tmp_path: Path
) -> None:
    key = network.create_api_key("dies")
    # The admin's override: one request in flight at a time for this key.
    network.query(
        "UPDATE tracker_app_apikey SET max_requests_in_flight = 1 WHERE name = %s", "dies"
    )
    assert network.database_url is not None
    with running_tracker(
        network.database_url, tmp_path, MESHNET_VAR_DIR=str(tmp_path / "var"), **SETTINGS
    ) as doomed:
        held = streams.open(doomed.url, key, max_tokens=4000)
        doomed.process.signal(signal.SIGKILL)
        doomed.process.wait(10)
        while_held = chat(network.url, key, max_tokens=8)
        time.sleep(LEASE_SECONDS + 0.5)
        after = chat(network.url, key, max_tokens=8)

    assert held.status_code == 200
    assert while_held.status_code == 429
    assert error_code(while_held) == "too_many_requests_in_flight"
    assert "1 requests in flight" in while_held.json()["error"]["message"]
    assert after.status_code == 200, after.text
