"""A request's admission: refused before anything streams, or its choices on one route.

A prompt past the context, or a request no route can serve, is refused
before anything is streamed or recorded, and holds none of its key's share;
a request reserves (prompt + ``max_tokens``) for each of its choices on its
key's share; each admitted choice runs its own prompt on the chosen route.
"""

from __future__ import annotations

import asyncio

import pytest

from meshnet_site.errors import DomainError, http_error
from nodes_app.shared.prefix_chain import block_hashes, chain_seed
from nodes_app.shared.prompting import prompt_token_ids
from routing_app.learning import prefix_memory
from routing_app.learning.prefix_memory import PrefixMemory
from routing_app.policies.choice import DecisionMode, RouteDecision
from tests.support.fake_heads import Net, serve
from tests.support.probe_answers import SPLIT
from tracker_app.completions.admission import Admitted, admitted_generations, kv_reservation
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.prompt_tokens import PromptCount, model_text
from tracker_app.models import ChatRequest, KeyLease


def params(*prompts: str, n: int = 1, max_tokens: int = 10) -> GenerationParams:
    return GenerationParams(
        model="tiny", prompts=prompts, stream=False, max_tokens=max_tokens, n=n, seed=7
    )


pytestmark = pytest.mark.django_db(transaction=True)


def test_a_prompt_past_the_context_is_refused_before_any_route_is_chosen(net: Net) -> None:
    net.model.weight_source = "builtin:tiny-random-llama"  # 4096 positions
    net.node("whole", 0, 3)
    proxy = net.proxy(messages=[{"role": "user", "content": "x" * 4000}], max_tokens=200)

    with pytest.raises(DomainError) as refused:
        asyncio.run(proxy.start())

    assert refused.value.code == "context_length_exceeded"
    assert http_error(refused.value).status == 400
    assert net.heads.requests == [] and not ChatRequest.objects.exists()


def test_with_no_route_the_request_is_refused_before_anything_is_streamed(net: Net) -> None:
    net.node("head-only", 0, 1)
    proxy = net.proxy()

    with pytest.raises(DomainError) as refused:
        asyncio.run(proxy.start())

    assert refused.value.code == "no_route"
    assert http_error(refused.value).status == 503
    assert not ChatRequest.objects.exists()


def test_a_refused_request_holds_none_of_its_keys_share(net: Net) -> None:
    net.node("head-only", 0, 1)

    with pytest.raises(DomainError):
        asyncio.run(net.proxy().start())

    assert not KeyLease.objects.exists()


def test_each_choice_reserves_its_prompt_and_max_tokens_on_the_keys_share() -> None:
    two_prompts = params("short", "longer", n=3, max_tokens=10)

    assert kv_reservation(two_prompts, [4, 9]) == 3 * (4 + 10) + 3 * (9 + 10)
    assert kv_reservation(params("hi", max_tokens=0), [5]) == 5


def test_each_admitted_choice_runs_its_own_prompt_on_the_chosen_route_from_its_start() -> None:
    decision = RouteDecision(SPLIT, DecisionMode.PINNED, 1)
    counts = [PromptCount(4, True), PromptCount(9, False)]
    readings = iter([10.0, 11.0, 12.0, 13.0])

    generations = admitted_generations(
        params("short", "longer", n=2), Admitted(counts, decision), clock=lambda: next(readings)
    )

    assert [g.choice for g in generations] == [0, 1, 2, 3]
    assert [g.prompt for g in generations] == ["short", "short", "longer", "longer"]
    assert [g.prompt_count for g in generations] == [counts[0], counts[0], counts[1], counts[1]]
    assert [g.sampling.seed for g in generations] == [7, 8, 7, 8]
    assert [(s.decision, s.replayed, s.started) for g in generations for s in g.segments] == [
        (decision, 0, 10.0),
        (decision, 0, 11.0),
        (decision, 0, 12.0),
        (decision, 0, 13.0),
    ]


def test_a_completed_scoped_request_leaves_its_prompt_warm_on_its_route_in_the_trackers_memory(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tracker names the prompt's blocks as the head claims them (the same chain, in
    the key's scope) and, once the route finished it, believes its nodes hold them."""
    memory = PrefixMemory()
    monkeypatch.setattr(prefix_memory, "_prefix_memory", memory)
    net.model.weight_source = "builtin:tiny-random-llama"
    net.node("whole", 0, 3)
    messages = [{"role": "user", "content": "the same long system prompt " * 40}]
    proxy = net.proxy(messages=messages)

    serve(proxy)

    [generation] = proxy.generations
    text = model_text(net.model.weight_source)
    assert text is not None
    ids = prompt_token_ids(text.tokenizer, messages)
    seed = chain_seed(net.model.key, proxy.prefix_scope)
    assert generation.prompt_count.blocks == tuple(block_hashes(seed, ids))
    held = memory.held(generation.route.plan, generation.prompt_count.route_prefix(12))
    assert held == (len(ids) - 1) // 32 > 4
