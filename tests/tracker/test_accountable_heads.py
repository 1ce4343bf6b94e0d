"""A head's claims are checked, and a false one counts against the head.

A real tracker (daphne), a real tiny ``runnode`` serving every layer, and
for each test a fresh fake head — a real HTTP server registered under a
wallet of its own; the tracker scouts every request while a route is not
proven, and once the honest route is measured again the new head's is the
one left unproven, so it is tried first — that lies: it refuses a prompt the tracker
counted as too long, answers busy while it serves nothing, or streams
``: step`` comments and never a token. Each test reproduces one such lie
and shows the head blamed and the client served (or told the truth) in
seconds, never after the busy deadline or never.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.fake_node import Behaviour, FakeHead
from tests.support.network import Network, start_network
from tests.support.sse import read_sse
from tracker_app.localnet import fresh_process_database, wait_until

TINY = "tiny-random-llama"
ONE_WORD = [{"role": "user", "content": "Hello"}]
BUSY_DEADLINE = 30.0
REQUEST_DEADLINE = 6.0


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """Tracker with one honest whole-model tiny node; heartbeats every second, so a
    busy claim goes unexplained for two seconds at most before it counts as a lie."""
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("accountable-heads")
        for network in start_network(
            database_url,
            tmp,
            MESHNET_RATE_LIMIT_PER_MINUTE="1000",
            # ADR-0021's policy scouting whenever a route is not proven: a new head's
            # route (never measured) goes first, and stays first while it is not caught.
            # (A claimed speed alone no longer puts it first once a route is measured.)
            MESHNET_ROUTE_POLICY="adr0021",
            MESHNET_ROUTE_EXPLORE_SHARE="1",
            MESHNET_NODE_HEARTBEAT_INTERVAL="1",
            MESHNET_BUSY_DEADLINE=str(BUSY_DEADLINE),
            MESHNET_REQUEST_DEADLINE=str(REQUEST_DEADLINE),
        ):
            network.add_node("honest", TINY, (0, 3), wait=False)
            network.wait_for_nodes()
            yield network


@pytest.fixture
def liar(network: Network) -> Iterator[FakeHead]:
    """A fresh fake head claiming 1e6 tok/s (the most a tracker accepts); it leaves the
    network after the test."""
    head = FakeHead().start()
    head.register(network.url, benchmark_tps=1e6)
    network.wait_for_route(TINY)
    # Its arrival changed the topology: the honest route is measured again (pinned), so
    # the one route left unproven, the one the next request scouts, is the liar's.
    honest = network.nodes["honest"].node_id

    def liar_next() -> bool:
        statuses = {route["hops"][0]["node_id"]: route["status"] for route in network.routes(TINY)}
        if statuses.get(honest) != "proven":
            warm_up = network.chat(model=TINY, messages=ONE_WORD, max_tokens=8, route=[honest])
            assert warm_up.status_code == 200, warm_up.text
            return False
        return statuses.get(head.node_id) == "unsampled"

    wait_until(liar_next, timeout=30, what="the honest route proven and the liar's unsampled")
    yield head
    head.deregister(network.url)
    head.stop()


def route_status(network: Network, head: FakeHead) -> str:
    return next(
        route["status"]
        for route in network.routes(TINY)
        if route["hops"][0]["node_id"] == head.node_id
    )


def served_by(response: httpx.Response) -> list[str]:
    return [hop["node_id"] for hop in response.json()["meshnet"]["hops"]]


def test_a_head_refusing_a_counted_prompt_as_too_long_is_banned_and_the_request_fails_over(
    network: Network, liar: FakeHead
) -> None:
    liar.behaviour = Behaviour(refuse=True, refuse_code="prompt_too_long")

    response = network.chat(model=TINY, messages=ONE_WORD, max_tokens=8, temperature=0)

    assert response.status_code == 200, response.text
    assert served_by(response) == [network.nodes["honest"].node_id]
    assert liar.generate_calls == 1
    assert route_status(network, liar) == "quarantined"


def test_a_head_answering_busy_while_idle_is_banned_in_seconds_not_after_the_busy_deadline(
    network: Network, liar: FakeHead
) -> None:
    liar.behaviour = Behaviour(busy=True)
    started = time.monotonic()

    response = network.chat(model=TINY, messages=ONE_WORD, max_tokens=8, temperature=0)

    took = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert served_by(response) == [network.nodes["honest"].node_id]
    assert took < BUSY_DEADLINE / 3, took  # two heartbeat intervals, and the back-off
    assert liar.generate_calls >= 2  # it was given the benefit of the doubt first
    assert route_status(network, liar) == "quarantined"


def test_concurrent_chats_retrying_on_a_head_answering_busy_do_not_explain_each_other(
    network: Network, liar: FakeHead
) -> None:
    liar.behaviour = Behaviour(busy=True)
    started = time.monotonic()

    with ThreadPoolExecutor(12) as pool:
        chats = [
            pool.submit(network.chat, model=TINY, messages=ONE_WORD, max_tokens=8, temperature=0)
            for _ in range(12)
        ]
        answers = [chat.result() for chat in chats]

    took = time.monotonic() - started
    assert [a.status_code for a in answers] == [200] * 12, [a.text for a in answers]
    assert took < BUSY_DEADLINE / 2, took
    assert route_status(network, liar) == "quarantined"


def test_a_head_streaming_more_step_comments_than_tokens_asked_is_banned_and_failed_over(
    network: Network, liar: FakeHead
) -> None:
    liar.behaviour = Behaviour(comments=True, gap=0.05)

    response = network.chat(model=TINY, messages=ONE_WORD, max_tokens=8, temperature=0)

    assert response.status_code == 200, response.text
    assert served_by(response) == [network.nodes["honest"].node_id]
    assert response.json()["usage"]["completion_tokens"] == 8
    assert route_status(network, liar) == "quarantined"


def test_a_head_streaming_only_comments_is_cut_off_at_the_request_deadline_unbilled(
    network: Network, liar: FakeHead
) -> None:
    # Comments well within the tokens asked, each well within the silence limit:
    # only the request's total deadline ends it.
    liar.behaviour = Behaviour(comments=True, gap=0.2)
    started = time.monotonic()

    frames = read_sse(
        f"{network.url}/v1/chat/completions",
        {"model": TINY, "messages": ONE_WORD, "max_tokens": 4000, "stream": True},
        headers=network.headers(),
        timeout=REQUEST_DEADLINE * 5,
    )

    took = time.monotonic() - started
    errors = [frame["error"] for frame in frames if isinstance(frame, dict) and "error" in frame]
    assert [error["code"] for error in errors] == ["request_deadline_exceeded"]
    assert liar.node_id in errors[0]["message"]
    assert REQUEST_DEADLINE <= took < REQUEST_DEADLINE + 5, took
    [(request_id, status)] = network.query(
        "SELECT id, status FROM tracker_app_chatrequest WHERE route_signature LIKE %s",
        f"%{liar.node_id}%",
    )
    assert status == "failed"
    assert (
        network.query("SELECT id FROM tracker_app_billingrecord WHERE request_id = %s", request_id)
        == []
    )
    assert route_status(network, liar) == "quarantined"
