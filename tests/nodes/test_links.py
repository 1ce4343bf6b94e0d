"""The head's hop links: a link on which nothing comes back is not reused.

A hung hop (``tests.support.hung_node``: it accepts the websocket and reads
every frame, and never answers) stands for a hop host gone without closing
its connection. The step times out by its deadline; the link it went out on
is forgotten, so the next step opens a new one instead of waiting out its own
deadline on a dead connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from nodes_app.runtime import wire
from nodes_app.runtime.links import HopLinks, LinkTimeout
from tests.support.hung_node import HungNode

STEP = wire.ForwardStep(
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
