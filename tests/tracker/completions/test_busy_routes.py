"""A busy route: waited for with back-off up to the busy deadline, never banned; load.

A full head (one that reports sessions, as an honestly full node does, or
streams another of this tracker's requests) is waited for; past
``MESHNET_BUSY_DEADLINE`` (every wait of the request counted together) the
request is a 503 ``route_busy`` with ``Retry-After``; a busy answer nothing
explains for long is a lie, and its node is banned. Every streaming choice
is load on its route until the request ends, and its route's book shows the
tokens it has relayed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from meshnet_site.errors import http_error
from routing_app.policies.load import route_load
from tests.support.fake_heads import (
    Behaviour,
    Net,
    answer,
    record,
    serve,
    served,
    text,
    texts_by_choice,
)
from tracker_app.completions import console
from tracker_app.completions.slots import BUSY_RETRY_AFTER_SECONDS
from tracker_app.models import RequestStatus

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_full_head_is_waited_for_and_nobody_is_banned(net: Net) -> None:
    net.node("whole", 0, 3, sessions=1)
    net.heads.plan("whole", Behaviour(status=503), Behaviour(tokens=0, then="busy"), Behaviour())
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.heads.heads_asked() == ["whole", "whole", "whole"]
    assert record(proxy).status == RequestStatus.COMPLETED
    assert net.banned() == set()


def frozen_time(*, busy_deadline: float) -> tuple[dict[str, Any], list[float]]:
    """A proxy's settings under which time passes only while it waits, and the list its
    waits go to."""
    now = [1000.0]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    return {"clock": lambda: now[0], "sleep": sleep, "busy_deadline": busy_deadline}, waits


def test_a_route_busy_past_the_busy_deadline_is_a_503_with_retry_after_and_bans_nobody(
    net: Net,
) -> None:
    net.node("whole", 0, 3, sessions=1)
    net.heads.plan("whole", Behaviour(status=503))
    frozen, waits = frozen_time(busy_deadline=10.0)
    proxy = net.proxy(settings=frozen)

    chunks, result = served(proxy)

    assert chunks[-1]["error"]["code"] == "route_busy"
    assert result.error is not None
    answer = http_error(result.error)
    assert (answer.status, answer.headers) == (503, {"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)})
    # Capped exponential back-off: each wait in the upper half of 50 ms, 100 ms, … 1 s, 1 s…,
    # the last one cut to end exactly at the deadline; one more look, then the 503.
    steps = [min(1.0, 0.05 * 2**attempt) for attempt in range(len(waits))]
    assert all(step / 2 <= wait <= step for wait, step in zip(waits[:-1], steps, strict=False))
    assert sum(waits) == pytest.approx(10.0) and len(waits) > 10
    assert len(net.heads.requests) == len(waits) + 1
    assert net.banned() == set()
    assert record(proxy).status == RequestStatus.FAILED


def test_a_hop_busy_behind_a_head_that_accepted_still_backs_off_to_the_deadline(
    net: Net,
) -> None:
    net.node("whole", 0, 3, sessions=1)
    net.heads.plan("whole", Behaviour(tokens=0, then="busy"))  # 200, then hop_busy
    frozen, waits = frozen_time(busy_deadline=10.0)
    proxy = net.proxy(settings=frozen)

    chunks = serve(proxy)

    assert chunks[-1]["error"]["code"] == "route_busy"
    # The head's 200 is not a slot: the back-off grows as when the head itself is full.
    steps = [min(1.0, 0.05 * 2**attempt) for attempt in range(len(waits))]
    assert all(step / 2 <= wait <= step for wait, step in zip(waits[:-1], steps, strict=False))
    assert sum(waits) == pytest.approx(10.0) and len(waits) < 20
    assert net.banned() == set()


def test_the_busy_deadline_counts_every_wait_of_a_request_not_each_wait_afresh(net: Net) -> None:
    net.node("first", 0, 3, tps=200.0, sessions=1)
    net.node("second", 0, 3, tps=100.0, sessions=1)
    net.heads.plan("first", *[Behaviour(status=503)] * 3, Behaviour(tokens=2, then="die"))
    net.heads.plan("second", Behaviour(status=503))
    frozen, waits = frozen_time(busy_deadline=10.0)
    proxy = net.proxy(settings=frozen)

    chunks = serve(proxy)

    assert text(chunks) == answer(2)
    assert chunks[-1]["error"]["code"] == "route_busy"
    # Three waits for the first head, then on the second route only what was left.
    assert sum(waits) == pytest.approx(10.0)
    assert net.heads.heads_asked()[:5] == ["first"] * 4 + ["second"]
    assert net.banned() == {"first"}


def test_every_streaming_choice_is_load_on_its_route_until_the_request_ends(net: Net) -> None:
    # The thompson-load policy weighs a route by the streams it carries: the
    # choice that waited for a slot counts again once it streams, and none
    # outlives the request.
    net.node("whole", 0, 3, sessions=1)
    paced = Behaviour(gap=0.02)
    net.heads.plan("whole", Behaviour(status=503), paced, paced)
    proxy = net.proxy(n=2, settings={"progress_interval": 0.0})
    load_seen: list[int] = []

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == console.PROGRESS:
            load_seen.append(route_load().snapshot().routes.get(net.route_signature(), 0))

    net.on_event = on_event

    chunks = serve(proxy)

    assert texts_by_choice(chunks) == {0: answer(12), 1: answer(12)}
    assert net.heads.heads_asked() == ["whole"] * 3
    assert max(load_seen) == 2
    assert route_load().snapshot().routes.get(net.route_signature(), 0) == 0


def test_a_request_whose_client_left_before_its_stream_began_is_no_load(net: Net) -> None:
    # The consumer fails a request whose client went away while its headers were being
    # sent; run() never began, so only fail() can take it off its route.
    net.node("whole", 0, 3, sessions=1)
    proxy = net.proxy()

    async def start_then_disconnect() -> tuple[int, int]:
        await proxy.start()
        chosen = route_load().snapshot().routes.get(net.route_signature(), 0)
        await proxy.fail("client disconnected", cancelled=True)
        return chosen, route_load().snapshot().routes.get(net.route_signature(), 0)

    assert asyncio.run(start_then_disconnect()) == (1, 0)
    assert record(proxy).status == RequestStatus.CANCELLED


def test_a_streaming_choice_shows_its_route_the_tokens_it_has_relayed(net: Net) -> None:
    # thompson-load reads a stream's pace (tokens on the route / time since it was sent
    # there) as an early sample: the book must hold what the client has been sent.
    net.node("whole", 0, 3, sessions=1)
    net.heads.plan("whole", Behaviour(gap=0.02))
    proxy = net.proxy(settings={"progress_interval": 0.0})
    seen: list[tuple[list[int], int]] = []  # (tokens the book shows, tokens relayed)

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == console.PROGRESS:
            paces = route_load().snapshot().paces.get(net.route_signature(), ())
            seen.append(([pace.tokens for pace in paces], data["tokens"]))

    net.on_event = on_event

    chunks = serve(proxy)

    assert texts_by_choice(chunks) == {0: answer(12)}
    streaming = [(shown, sent) for shown, sent in seen if sent]
    assert len(streaming) >= 3
    assert all(shown == [sent] for shown, sent in streaming)


def test_a_busy_answer_this_trackers_own_streams_explain_is_waited_for(net: Net) -> None:
    # The node reports no sessions, but the request's other choice streams from it:
    # a node with room for one session is honestly full.
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(gap=0.02), Behaviour(status=503), Behaviour())
    proxy = net.proxy(n=2, settings={"busy_claim_grace": 0.0})

    chunks = serve(proxy)

    assert texts_by_choice(chunks) == {0: answer(12), 1: answer(12)}
    assert net.banned() == set()


def test_a_busy_answer_nothing_explains_past_the_grace_bans_the_node_and_fails_over(
    net: Net,
) -> None:
    net.node("idle-liar", 0, 3, tps=1e6)
    net.node("honest", 0, 3)
    net.heads.plan("idle-liar", Behaviour(status=503))
    proxy = net.proxy(settings={"busy_claim_grace": 0.0})

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.heads.heads_asked() == ["idle-liar", "honest"]
    assert net.banned() == {"idle-liar"}
    assert record(proxy).status == RequestStatus.COMPLETED
