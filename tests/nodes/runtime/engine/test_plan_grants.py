"""What a plan lets a hop hold: the tracker's bounds, not the head's wishes.

A malicious head is a client of a hop's link with a valid plan (the test signs
it with the tracker's key, with the bounds the tracker gives such a request:
``nodes_app.plans.session_bounds``). It may ask the hop for no more positions
than the plan grants, and a session it abandons ends at the plan's idle bound,
not after the node's 600 s idle timeout, so an honest chat on the same tail is
served. Real processes: a ``runtracker`` under daphne, a tiny-model head and a
tail whose KV budget holds 128 positions of its two layers.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from nodes_app.plans import session_bounds
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.signed_plan import SignedPlan
from nodes_app.runtime.engine.trust import new_capability
from nodes_app.runtime.wire.entries import StepAnswer
from tests.support.link import LinkClient, node_link, tiny_step
from tests.support.network import Network, start_network
from tests.support.nodes import TINY
from tests.support.plans import signed_plan, tracker_key
from tracker_app.completions.head_stream import silence_limit
from tracker_app.localnet import fresh_process_database, wait_until

STEP_TIMEOUT = 1.0  # the tracker's MESHNET_HOP_STEP_TIMEOUT here: plans bound idle time by it
# The tail's layers 2-3 of the tiny model keep 512 bytes of K/V per position.
TAIL_POSITIONS = 128
TAIL_KV_MIB = TAIL_POSITIONS * 512 / 2**20
# A request the tracker would plan for: a prompt it counted, and max_tokens.
PROMPT_TOKENS = 20
MAX_TOKENS = 100


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("plan-grants")
        settings = {
            "MESHNET_HOP_STEP_TIMEOUT": str(STEP_TIMEOUT),
            "MESHNET_BUSY_DEADLINE": "60",
            "MESHNET_RATE_LIMIT_PER_MINUTE": "1000",
        }
        for network in start_network(database_url, tmp, **settings):
            network.add_node("head", TINY, (0, 1), wait=False)
            network.add_node("tail", TINY, (2, 3), extra=["--kv-budget", str(TAIL_KV_MIB)])
            network.wait_for_route(TINY)
            yield network


def granted_plan(network: Network, request_id: str) -> SignedPlan:
    """A plan of ``request_id`` over head and tail, bounded as the tracker bounds a
    request of ``PROMPT_TOKENS`` and ``MAX_TOKENS``, signed with the tracker's key."""
    head, tail = network.nodes["head"], network.nodes["tail"]
    hops = [head.hop(), tail.hop()]
    request = GenerateRequest.parse(
        {
            "request_id": request_id,
            "messages": [{"role": "user", "content": "anything"}],
            "max_tokens": MAX_TOKENS,
            "plan": {"model": TINY, "hops": hops},
        }
    )
    silence = silence_limit(step_timeout=STEP_TIMEOUT, hops=2, positions=PROMPT_TOKENS)
    bounds = session_bounds(
        request, prompt_tokens=PROMPT_TOKENS, silence=silence, issued=time.time()
    )
    return signed_plan(
        tracker_key(network.tracker_key_file),
        request_id=request_id,
        model=TINY,
        hops=hops,
        max_positions=bounds.max_positions,
        ends_at=bounds.ends_at,
        idle_seconds=bounds.idle_seconds,
    )


def opening(
    link: LinkClient, plan: SignedPlan, session: str, *, rows: int, reserve: int | None
) -> tuple[StepAnswer, str]:
    """A head's opening step of ``session`` on the tail, asking to reserve ``reserve``."""
    capability = new_capability()
    step = tiny_step(session, rows)
    answer = link.step(
        dataclasses.replace(step, reserve=reserve),
        bytes(4 * 64 * rows),
        capability=capability,
        plan=plan.to_header(),
    )
    return answer, capability


def refused(answer: StepAnswer, status: int, code: str) -> None:
    assert (answer.status, answer.code) == (status, code), answer
    assert answer.error_type and answer.message


def sessions(network: Network, name: str) -> int:
    return int(network.nodes[name].health()["active_sessions"])


def chat(network: Network) -> httpx.Response:
    return network.chat(
        model=TINY, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0.0
    )


def test_a_head_that_asks_a_hop_for_more_than_its_plan_grants_is_refused(
    network: Network,
) -> None:
    request_id = f"greedy-{uuid.uuid4().hex}"
    plan = granted_plan(network, request_id)
    granted = PROMPT_TOKENS + MAX_TOKENS
    assert plan.max_positions == granted

    with node_link(network.nodes["tail"].endpoint) as link:
        # The whole context, for a request the tracker planned 120 positions for.
        greedy, _ = opening(link, plan, f"{request_id}.a", rows=3, reserve=4096)
        refused(greedy, 403, "plan_exceeded")
        past, _ = opening(link, plan, f"{request_id}.b", rows=granted + 1, reserve=None)
        refused(past, 403, "plan_exceeded")
        assert sessions(network, "tail") == 0
        # What the plan grants is served, and nothing past it later on.
        honest, capability = opening(link, plan, f"{request_id}.c", rows=3, reserve=granted)
        assert honest.status == 200, honest
        later = tiny_step(f"{request_id}.c", granted - 2, position=3)
        beyond = link.step(later, bytes(4 * 64 * (granted - 2)), capability=capability)
        refused(beyond, 403, "plan_exceeded")
        assert link.cancel(f"{request_id}.c", capability=capability).status == 204
    assert sessions(network, "tail") == 0


def test_sessions_a_head_abandons_end_at_its_plans_bound_and_an_honest_chat_is_served(
    network: Network,
) -> None:
    plans = [granted_plan(network, f"abandoned-{uuid.uuid4().hex}") for _ in range(2)]
    with node_link(network.nodes["tail"].endpoint) as link:
        # Two sessions of 60 positions each: 8 of the tail's 128 are left.
        for plan in plans:
            answer, _ = opening(link, plan, f"{plan.request_id}.s", rows=3, reserve=60)
            assert answer.status == 200, answer
        opened = time.monotonic()
        assert sessions(network, "tail") == 2
        # The head never steps or cancels them again, and keeps its link open.
        served = chat(network)
        waited = time.monotonic() - opened

    assert served.status_code == 200, served.text
    assert served.json()["choices"][0]["message"]["content"]
    # The chat waited for the abandoned sessions to end (2 silence limits of
    # 3 s each), far sooner than the node's own idle timeout (600 s).
    assert plans[0].idle_seconds - 1 <= waited < 60
    wait_until(lambda: sessions(network, "tail") == 0)
    assert "banned" not in network.nodes["tail"].output()


def test_a_nodes_health_page_shows_strangers_no_exact_free_kv(network: Network) -> None:
    tail = network.nodes["tail"]
    plan = granted_plan(network, f"load-{uuid.uuid4().hex}")
    with node_link(tail.endpoint) as link:
        answer, capability = opening(link, plan, f"{plan.request_id}.s", rows=3, reserve=77)
        assert answer.status == 200, answer
        page = httpx.get(f"{tail.endpoint}/v1/health", timeout=30)
        assert link.cancel(f"{plan.request_id}.s", capability=capability).status == 204

    health: dict[str, Any] = page.json()
    budget, reserved = TAIL_POSITIONS * 512, 77 * 512
    assert "kv_budget_bytes" not in health and "kv_reserved_bytes" not in health
    for exact in (budget, reserved, budget - reserved):
        assert str(exact) not in page.text
    # 77 of 128 positions: more than half in use, as a stranger may see it.
    assert health["kv_load"] == 0.75
