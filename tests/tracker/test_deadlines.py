"""The tracker's deadlines: a hung node is failed over within its step timeout; a busy route
is waited for with back-off up to the busy deadline, then refused 503 with Retry-After.

The rules are checked where they are computed (the back-off, the head's silence limit);
the behaviour runs against a real tracker and real tiny-model nodes, with a hung node
(``tests.support.hung_node``: registered, takes work, never answers) on the route the
tracker prefers.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nodes_app.protocol.limits import STEP_TIMEOUT_POSITIONS, step_time_limit
from tests.support.hung_node import HungNode
from tests.support.network import Network, head_tail_answer, start_network
from tests.support.plans import signed, tracker_key
from tests.support.sse import chunks_of, read_sse, text_of
from tracker_app.completions.head_stream import silence_limit
from tracker_app.completions.slots import BUSY_RETRY_AFTER_SECONDS, busy_retry_delay
from tracker_app.localnet import fresh_process_database

TINY = "tiny-random-llama"
PROMPT = [{"role": "user", "content": "Tell me about meshes."}]
STEP = 3.0  # MESHNET_HOP_STEP_TIMEOUT of this module's tracker and nodes
BUSY = 1.0  # MESHNET_BUSY_DEADLINE of this module's tracker
# A hung node claims to be far faster than a real tiny node, so the tracker
# (which proves no route here) tries the route through it first.
HUNG_CLAIMED_TPS = 500_000.0
# What a client waits for an answer: far less than the 300 s a hung hop used to stall it.
CLIENT_TIMEOUT = 60.0


# --- the rules ----------------------------------------------------------------------------


def test_busy_retries_back_off_exponentially_with_jitter_up_to_a_one_second_cap() -> None:
    rng = random.Random(12)
    delays = [busy_retry_delay(attempt, rng=rng) for attempt in range(12)]

    steps = [min(1.0, 0.05 * 2**attempt) for attempt in range(12)]
    assert all(step / 2 <= delay <= step for delay, step in zip(delays, steps, strict=True))
    assert steps[:6] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0] and max(delays) <= 1.0
    other = [busy_retry_delay(attempt, rng=random.Random(13)) for attempt in range(12)]
    assert other != delays  # the jitter is real: two waiting requests do not retry in step


@pytest.mark.parametrize("hops", [1, 2, 5])
def test_the_tracker_waits_for_a_head_longer_than_the_head_waits_for_all_its_hops(
    hops: int,
) -> None:
    # The head's own layers and every downstream hop, each at its limit, then the
    # head's report: a hung hop is reported by the head before the head looks hung.
    for positions in (1, 900):
        longest_step = hops * step_time_limit(STEP, positions)
        assert silence_limit(step_timeout=STEP, hops=hops, positions=positions) > longest_step


# --- through real processes ---------------------------------------------------------------


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """Tracker + head (0-1, one session at a time) + tail (2-3), short deadlines.

    No route is ever proven (the sample threshold is out of reach), so the
    tracker always takes the best prior: a hung node claiming more speed is tried first.
    """
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("deadlines")
        for network in start_network(
            database_url,
            tmp,
            MESHNET_RATE_LIMIT_PER_MINUTE="1000",
            MESHNET_HOP_STEP_TIMEOUT=str(STEP),
            MESHNET_BUSY_DEADLINE=str(BUSY),
            MESHNET_ROUTE_MIN_SAMPLE_TOKENS="1000000",
        ):
            network.add_node("head", TINY, (0, 1), extra=("--max-sessions", "1"), wait=False)
            network.add_node("tail", TINY, (2, 3), wait=False)
            network.wait_for_nodes()
            yield network


def stream(network: Network, max_tokens: int) -> list[Any]:
    return read_sse(
        f"{network.url}/v1/chat/completions",
        {"model": TINY, "messages": PROMPT, "max_tokens": max_tokens, "temperature": 0,
         "stream": True},
        headers=network.headers(),
        timeout=CLIENT_TIMEOUT,
    )  # fmt: skip


@pytest.fixture
def hung(network: Network, request: pytest.FixtureRequest) -> Iterator[HungNode]:
    """A hung node over the layers the test names, registered; deregistered and stopped after."""
    start, end = request.param
    node = HungNode(start=start, end=end).start_serving()
    node.register(network.url, benchmark_tps=HUNG_CLAIMED_TPS)
    try:
        yield node
    finally:
        node.deregister(network.url)
        node.stop()


def assert_served_whole_through_the_other_route(
    network: Network, hung: HungNode, frames: list[Any], max_tokens: int
) -> None:
    """The client saw one uninterrupted answer; the database holds it completed, billed once,
    with nothing for the hung node; the hung node is quarantined."""
    assert hung.asked.is_set()  # the request really went to the hung node first
    assert hung.node_id in chunks_of(frames)[0]["meshnet"]["route"]
    assert frames[-1] == "[DONE]"
    assert not [f for f in frames if isinstance(f, dict) and "error" in f]
    assert text_of(frames) == head_tail_answer(network, PROMPT, max_tokens)
    assert chunks_of(frames)[-1]["usage"]["completion_tokens"] == max_tokens

    [(request_id, status, signature)] = network.query(
        "SELECT id, status, route_signature FROM tracker_app_chatrequest "
        "WHERE completion_tokens = %s",
        max_tokens,
    )
    head, tail = network.nodes["head"], network.nodes["tail"]
    assert status == "completed"
    assert signature == f"{TINY} | {head.node_id}[0-1] -> {tail.node_id}[2-3]"
    [(billing_id,)] = network.query(
        "SELECT id FROM tracker_app_billingrecord WHERE request_id = %s", request_id
    )
    paid = network.query(
        "SELECT node_id FROM tracker_app_workunit WHERE billing_id = %s ORDER BY start_layer",
        billing_id,
    )
    assert paid == [(head.node_id,), (tail.node_id,)]
    quarantined = {r["signature"] for r in network.routes(TINY) if r["status"] == "quarantined"}
    assert quarantined and all(hung.node_id in signature for signature in quarantined)


@pytest.mark.parametrize("hung", [(2, 3)], indirect=True)
def test_a_hop_that_never_answers_is_failed_over_within_the_step_timeout(
    network: Network, hung: HungNode
) -> None:
    # The head gives the hung tail one step timeout, then reports it by node id.
    frames = stream(network, max_tokens=16)

    assert_served_whole_through_the_other_route(network, hung, frames, max_tokens=16)


@pytest.mark.parametrize("hung", [(0, 3)], indirect=True)
def test_a_head_that_accepts_and_goes_silent_is_failed_over_within_its_silence_limit(
    network: Network, hung: HungNode
) -> None:
    # The hung head answers 200 and the role frame, then nothing: the tracker gives up on it.
    frames = stream(network, max_tokens=18)

    assert_served_whole_through_the_other_route(network, hung, frames, max_tokens=18)


def test_a_route_busy_past_the_busy_deadline_is_a_503_with_retry_after_and_bans_nobody(
    network: Network,
) -> None:
    head = network.nodes["head"]
    # The head's one session is held by a generation whose next hop never answers;
    # its prompt is long enough that the head waits several step timeouts for it.
    holder = HungNode(start=2, end=3).start_serving()
    long_prompt = [{"role": "user", "content": "m" * (2 * STEP_TIMEOUT_POSITIONS)}]
    payload = {
        "request_id": f"holder-{time.monotonic_ns()}",
        "plan": {"model": TINY, "hops": [head.hop(), holder.hop()]},
        "messages": long_prompt,
        "max_tokens": 4,
        "temperature": 0.0,
    }
    payload = signed(payload, tracker_key(network.tracker_key_file))
    held: list[Any] = []
    holding = threading.Thread(
        target=lambda: held.extend(read_sse(f"{head.endpoint}/v1/generate", payload))
    )
    holding.start()
    try:
        assert holder.asked.wait(30)
        assert head.health()["active_sessions"] == 1

        response = network.chat(model=TINY, messages=PROMPT, max_tokens=10, temperature=0)
    finally:
        holder.stop()
        holding.join(30)

    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == str(BUSY_RETRY_AFTER_SECONDS)
    error = response.json()["error"]
    assert error["code"] == "route_busy" and error["type"] == "server_error"
    assert "session cap" in error["message"]
    assert network.query(
        "SELECT status FROM tracker_app_chatrequest WHERE error LIKE %s", "%session cap%"
    ) == [("failed",)]
    assert not network.query(
        "SELECT b.id FROM tracker_app_billingrecord b JOIN tracker_app_chatrequest r "
        "ON r.id = b.request_id WHERE r.status = 'failed'"
    )
    assert all(route["status"] != "quarantined" for route in network.routes(TINY))
    # The slot is free again: the same route serves the next request.
    assert network.chat(model=TINY, messages=PROMPT, max_tokens=10).status_code == 200
