"""The head's hop links: a link on which nothing comes back is not reused.

A hung hop (``tests.support.hung_node``: it accepts the websocket and reads
every frame, and never answers) stands for a hop host gone without closing
its connection. The step times out by its deadline; the link it went out on
is forgotten, so the next step opens a new one instead of waiting out its own
deadline on a dead connection. A hop that answers with a malformed frame
loses its link the same way; a well-formed answer reaches its step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import websockets.asyncio.server
from websockets.asyncio.server import ServerConnection

from nodes_app.runtime.head.hop_links import HopLinks, LinkDropped, LinkTimeout
from nodes_app.runtime.wire.entries import ForwardStep, StepAnswer
from nodes_app.runtime.wire.frames import encode_answers
from tests.support.hung_node import HungNode

STEP = ForwardStep(
    session_id="s-1", start=2, end=2, position=0, dtype="float32", shape=(1, 1, 64), sampling=None
)


@pytest.fixture
def hung() -> Iterator[HungNode]:
    node = HungNode(start=2, end=3).start_serving()
    try:
        yield node
    finally:
        node.stop()


def test_a_link_that_answered_nothing_within_a_steps_deadline_is_replaced(
    hung: HungNode,
) -> None:
    async def run() -> tuple[bool, bool]:
        links = HopLinks()
        first = links.to(hung.endpoint)
        try:
            with pytest.raises(LinkTimeout):
                await first.step(STEP, bytes(4 * 64), capability=None, plan=None, timeout=0.5)
            return first.closed, links.to(hung.endpoint) is first
        finally:
            await links.aclose()

    assert asyncio.run(run()) == (True, False)
    assert hung.asked.is_set()  # the step really went out on the link


async def answering_hop(reply: bytes) -> tuple[Any, str]:
    """A hop on loopback that accepts a link's hello and answers every later frame with
    ``reply`` (its server and endpoint)."""

    async def serve(websocket: ServerConnection) -> None:
        await websocket.recv()
        await websocket.send(encode_answers([StepAnswer(0, status=204)]))
        async for _ in websocket:
            await websocket.send(reply)

    server = await websockets.asyncio.server.serve(serve, "127.0.0.1", 0)
    port = next(iter(server.sockets)).getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    "reply",
    [
        encode_answers([StepAnswer(1, token_id=7)])[:-1],  # compact, cut short
        b"\x05\x00\x00\x00nope!",
    ],
)
def test_a_hop_that_answers_with_a_malformed_frame_loses_its_link(reply: bytes) -> None:
    async def run() -> tuple[bool, bool]:
        server, endpoint = await answering_hop(reply)
        links = HopLinks()
        link = links.to(endpoint)
        try:
            with pytest.raises(LinkDropped, match="malformed"):
                await link.step(STEP, bytes(4 * 64), capability=None, plan=None, timeout=5.0)
            return link.closed, links.to(endpoint) is link
        finally:
            await links.aclose()
            server.close()

    assert asyncio.run(run()) == (True, False)


def test_a_hops_compact_answer_reaches_the_step_waiting_for_it() -> None:
    async def run() -> StepAnswer:
        server, endpoint = await answering_hop(encode_answers([StepAnswer(1, token_id=7)]))
        links = HopLinks()
        try:
            return await links.to(endpoint).step(
                STEP, bytes(4 * 64), capability=None, plan=None, timeout=5.0
            )
        finally:
            await links.aclose()
            server.close()

    assert asyncio.run(run()) == StepAnswer(1, token_id=7)
