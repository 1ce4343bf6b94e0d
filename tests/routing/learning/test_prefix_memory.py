"""The tracker's memory of warm prefixes (ADR-0029): which nodes hold which prompt blocks,
shared between tracker processes, and a request's warmth on a route."""

from __future__ import annotations

import math

import pytest

from routing_app.learning.prefix_memory import (
    PREFIX_MEMORY_SECONDS,
    PREFIX_SHARE_SECONDS,
    PrefixMemory,
    RequestPrefix,
    warmth,
)
from routing_app.learning.route_costs import RouteCostBook, RouteCosts
from routing_app.planning.search import enumerate_routes
from tests.support.routing import ManualClock, record

# A head and two tails: two routes sharing the head.
NODES = [record("head", 0, 14), record("tail-a", 15, 29), record("tail-b", 15, 29)]
VIA_A, VIA_B = sorted(
    enumerate_routes(model_key="m", num_layers=30, nodes=NODES), key=lambda p: p.node_ids
)
CHAIN = tuple(f"block-{i}" for i in range(20))


def asked(blocks: int, *, prompt: int | None = None, output: int = 100) -> RequestPrefix:
    """A request whose prompt starts with ``blocks`` of CHAIN (then its own)."""
    chain = CHAIN[:blocks] + tuple(f"other-{i}" for i in range(blocks, 20))
    return RequestPrefix(blocks=chain, prompt_tokens=prompt or 20 * 32 + 5, output_tokens=output)


def test_a_route_holds_the_leading_blocks_every_one_of_its_nodes_finished() -> None:
    memory = PrefixMemory(clock=ManualClock())
    memory.served(plan=VIA_A, blocks=CHAIN[:12])

    assert memory.held(VIA_A, asked(20)) == 12
    assert memory.held(VIA_A, asked(5)) == 5  # the conversation went elsewhere after 5
    assert memory.held(VIA_A, asked(0)) == 0
    # The other route shares the head, but its tail never computed these blocks.
    assert memory.held(VIA_B, asked(20)) == 0


def test_the_block_that_ends_the_prompt_is_never_counted_held() -> None:
    """The head computes the prompt's last token however much is cached."""
    memory = PrefixMemory(clock=ManualClock())
    memory.served(plan=VIA_A, blocks=CHAIN[:4])

    assert memory.held(VIA_A, RequestPrefix(CHAIN[:4], prompt_tokens=128, output_tokens=9)) == 3
    assert memory.held(VIA_A, RequestPrefix(CHAIN[:4], prompt_tokens=129, output_tokens=9)) == 4


def test_a_prefix_not_served_for_the_memory_s_time_is_no_longer_counted() -> None:
    clock = ManualClock()
    memory = PrefixMemory(clock=clock, seconds=600.0)
    memory.served(plan=VIA_A, blocks=CHAIN[:12])
    clock.advance(500.0)
    memory.served(plan=VIA_A, blocks=CHAIN[:3])  # a shorter conversation refreshed 3
    clock.advance(200.0)

    assert memory.held(VIA_A, asked(20)) == 3


def test_the_memory_keeps_only_its_most_recent_pairs() -> None:
    memory = PrefixMemory(clock=ManualClock(), pairs=8)
    memory.served(plan=VIA_A, blocks=CHAIN[:10])  # 20 (node, block) pairs

    assert len(memory._held) == 8
    # The head's pairs were written first and are gone: the route holds nothing whole.
    assert memory.held(VIA_A, asked(20)) == 0


def test_warmth_is_the_log_of_the_request_s_time_cold_over_its_time_warm() -> None:
    costs = RouteCosts(prompt=0.01, answer=0.1, answer_tokens=20.0)
    prefix = RequestPrefix(CHAIN, prompt_tokens=650, output_tokens=256)

    # Cold: 650 × 0.01 + 20 × 0.1 = 8.5 s; 16 blocks held save 512 × 0.01 = 5.12 s.
    assert warmth(held=16, prefix=prefix, costs=costs) == pytest.approx(math.log(8.5 / 3.38))
    assert warmth(held=0, prefix=prefix, costs=costs) == 0.0
    assert warmth(held=16, prefix=prefix, costs=RouteCosts(prompt=0.01)) == 0.0


def test_a_request_is_warm_only_on_routes_holding_its_prefix() -> None:
    memory, costs = PrefixMemory(clock=ManualClock()), RouteCostBook()
    memory.served(plan=VIA_A, blocks=CHAIN[:16])
    costs.timed(
        plan=VIA_B, prompt_computed=650, first_token_seconds=6.5, output_tokens=21, seconds=8.5
    )

    warm = memory.warmth([VIA_A, VIA_B], asked(16, prompt=650, output=256), costs)

    # Learned on the model's other route: 0.01 s a prompt token, 0.1 s an answer token,
    # 21 tokens an answer: 8.6 s cold, 3.48 s warm.
    assert set(warm) == {VIA_A.signature}
    assert warm[VIA_A.signature] == pytest.approx(math.log(8.6 / 3.48))
    assert memory.warmth([VIA_A, VIA_B], asked(0), costs) == {}


def test_a_process_exports_what_its_routes_served_lately_and_a_peer_takes_it_in() -> None:
    clock = ManualClock()
    first, second = PrefixMemory(clock=clock), PrefixMemory(clock=clock)
    first.served(plan=VIA_A, blocks=CHAIN[:4])
    clock.advance(PREFIX_SHARE_SECONDS + 1)
    first.served(plan=VIA_A, blocks=CHAIN[:12])

    exported = first.export()
    second.absorb(exported)
    second.absorb(exported)  # read twice: nothing changes

    assert [len(batch["blocks"]) for batch in exported] == [12]  # the first batch is old news
    assert second.held(VIA_A, asked(20)) == 12
    assert second.export() == []  # what it took in is not its own to publish
    # A peer's older news never makes a pair look older than it is.
    second.absorb([{"at": clock.now - 500, "nodes": ["head"], "blocks": list(CHAIN[:12])}])
    clock.advance(PREFIX_MEMORY_SECONDS - 10)
    assert second.held(VIA_A, asked(20)) == 12
