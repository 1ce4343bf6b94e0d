"""Prefix claims on a hop's link, in process: a tail that never sees a token reuses a prefix.

The tail (layers 2-3 of the tiny model, dev-open) is stepped as a head steps
it. A session kept under a chain at its end lets the next session claiming
that chain start past its blocks, answering what a full prefill answers;
whatever the head settles on below what the hop holds works too; what a
claim may not do is refused alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch
from starlette.testclient import TestClient

from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.trust import Grant, PlanGate
from nodes_app.runtime.hop import prefix_claim
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.server import create_app
from nodes_app.runtime.wire.entries import ClaimEntry
from nodes_app.runtime.wire.tensors import tensor_to_bytes
from nodes_app.shared.prefix_chain import block_hashes, chain_seed
from nodes_app.shared.sources import resolve_source
from tests.support.link import HIDDEN, LinkClient, in_process_link, tiny_step

PROMPT = 70  # positions: two blocks of 32 and six more
HIDDEN_STATES = torch.randn(1, PROMPT, HIDDEN, generator=torch.Generator().manual_seed(5))
# The hop never sees tokens: any chain the head computed names the prefix.
HASHES = block_hashes(chain_seed("tiny", "t"), list(range(PROMPT)))


def rows(first: int, last: int) -> bytes:
    return tensor_to_bytes(HIDDEN_STATES[:, first:last].contiguous())


@pytest.fixture(scope="module")
def service() -> NodeService:
    torch.set_num_threads(1)
    shard = load_shard(
        model_key="tiny-random-llama",
        source=resolve_source("tiny-random-llama"),
        start=2,
        end=3,
        progress=False,
    )
    return NodeService(shard, node_id="tail", gate=PlanGate(dev_open=True), kv_budget=2**26)


@pytest.fixture(scope="module")
def client(service: NodeService) -> Iterator[TestClient]:
    with TestClient(create_app(service, max_frame_bytes=2**20)) as test_client:
        yield test_client


@pytest.fixture
def link(client: TestClient) -> Iterator[LinkClient]:
    with in_process_link(client) as opened:
        yield opened


@pytest.fixture(scope="module")
def full_prefill_token(client: TestClient) -> int:
    """The token a full prefill answers, the cache kept under the chain at the end."""
    with in_process_link(client) as link:
        assert (link.claim("fill", HASHES).blocks, link.claim("x", []).blocks) == (0, 0)
        link.cancel("x")
        answer = link.step(tiny_step("fill", PROMPT), rows(0, PROMPT))
        assert answer.status == 200, answer.message
        assert link.cancel("fill", keep=HASHES).status == 204
        return int(answer.token_id)


def test_a_claim_of_a_kept_chain_starts_past_its_blocks_and_answers_the_same(
    link: LinkClient, service: NodeService, full_prefill_token: int
) -> None:
    hits = service.store.prefix.hits
    claimed = link.claim("again", HASHES)
    assert (claimed.status, claimed.blocks, claimed.exact) == (200, 2, False)

    answer = link.step(tiny_step("again", PROMPT - 64, position=64), rows(64, PROMPT))

    assert (answer.status, answer.token_id) == (200, full_prefill_token)
    assert service.store.prefix.hits == hits + 1
    link.cancel("again")


def test_a_route_may_start_below_what_the_hop_holds(
    link: LinkClient, full_prefill_token: int
) -> None:
    assert link.claim("lower", HASHES).blocks == 2
    answer = link.step(tiny_step("lower", PROMPT - 32, position=32), rows(32, PROMPT))
    assert (answer.status, answer.token_id) == (200, full_prefill_token)
    link.cancel("lower")

    assert link.claim("none", HASHES).blocks == 2
    answer = link.step(tiny_step("none", PROMPT), rows(0, PROMPT))
    assert (answer.status, answer.token_id) == (200, full_prefill_token)
    link.cancel("none")


def test_a_first_step_past_what_was_claimed_is_refused(
    link: LinkClient, full_prefill_token: int
) -> None:
    assert link.claim("past", HASHES[:1]).blocks == 1

    answer = link.step(tiny_step("past", PROMPT - 64, position=64), rows(64, PROMPT))

    assert (answer.status, answer.code) == (400, "position_mismatch")
    link.cancel("past")


def test_a_claim_the_hop_may_not_grant_is_refused_alone(link: LinkClient) -> None:
    assert link.claim("twice", HASHES).status == 200
    again = link.claim("twice", HASHES)
    head = link.claim("head", HASHES, start=0, end=3)
    elsewhere = link.claim("far", HASHES, start=1, end=3)

    assert (again.status, again.code) == (400, "session_exists")
    assert (head.status, head.code) == (400, "layers_out_of_range")
    assert (elsewhere.status, elsewhere.code) == (400, "layers_out_of_range")
    link.cancel("twice")


def test_a_signed_plan_without_a_scope_reuses_nothing_on_the_hop(
    service: NodeService, full_prefill_token: int
) -> None:
    lookups = service.store.prefix.lookups

    async def claim(session: str, scope: str | None) -> int:
        entry = ClaimEntry(1, session, 2, 3, 96, tuple(HASHES))
        answer = await prefix_claim.answer(service, entry, Grant(prefix_scope=scope))
        service.cancel(session)
        return int(answer.blocks)

    # A signed plan's empty scope; a dev-open node's none at all (the head's chain trusted).
    assert asyncio.run(claim("signed", "")) == 0
    assert service.store.prefix.lookups == lookups
    assert asyncio.run(claim("dev-open", None)) == 2
