"""What a head is sent, and how long it may stay silent.

A choice's first send is its prompt along its route, for ``max_tokens``, its
plan signed by the tracker and kept as what the relayed text is held to; the
prompt's scores are asked only when the request scores its prompt. The head
may stay silent one step limit per hop, and one more. (Reading the head's
stream is tested against fake heads: ``test_proxy``, ``test_failover``.)
"""

from __future__ import annotations

import json
import time
from typing import Any

from django.conf import settings

from nodes_app.plans import tracker_public_key
from nodes_app.protocol.errors import BAD_GRAMMAR
from nodes_app.protocol.limits import step_time_limit
from nodes_app.shared.signing import public_key_from_hex, verify_plan
from routing_app.policies.choice import DecisionMode, RouteDecision
from tests.support.probe_answers import SPLIT
from tracker_app.completions.chat_request import chat_params_parse
from tracker_app.completions.generation import Generation, Segment
from tracker_app.completions.head_stream import HopFailure, head_request, silence_limit
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.prompt_tokens import PromptCount
from tracker_app.completions.text_request import text_completion_params_parse

MESSAGES = [{"role": "user", "content": "Hi"}]


def chat(**fields: Any) -> GenerationParams:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 7, **fields}
    return chat_params_parse(json.dumps(body).encode())


def text(**fields: Any) -> GenerationParams:
    body = {"model": "m", "prompt": "Once upon a time", **fields}
    return text_completion_params_parse(json.dumps(body).encode())


def on_split_route(params: GenerationParams) -> Generation:
    """The request's first choice, on the route head h (0-1) → tail t (2-3)."""
    generation = Generation(
        choice=0,
        prompt=params.prompt_of(0),
        prompt_count=PromptCount(5, True),
        sampling=params.sampling(0),
    )
    generation.segments.append(Segment(RouteDecision(SPLIT, DecisionMode.PINNED, 1), 0, 0.0))
    return generation


def test_a_choices_first_send_is_its_prompt_along_its_route_signed_by_the_tracker() -> None:
    params = chat()
    generation = on_split_route(params)

    request = head_request(generation, params=params, request_id="r-1")

    assert [hop.node_id for hop in request.hops] == ["h", "t"]
    assert [(hop.start_layer, hop.end_layer) for hop in request.hops] == [(0, 1), (2, 3)]
    assert (request.request_id, request.messages, request.prompt) == ("r-1", MESSAGES, None)
    assert (request.max_tokens, request.resume_token_ids, request.echo) == (7, [], False)
    key = public_key_from_hex(tracker_public_key())
    assert verify_plan(key, request.plan.signed_fields(), request.signature)
    assert generation.sent is request  # the limits the relayed text is held to


def test_every_send_is_signed_afresh() -> None:
    params = chat()
    generation = on_split_route(params)

    first = head_request(generation, params=params, request_id="r")
    again = head_request(generation, params=params, request_id="r")

    assert first.signature != again.signature
    assert generation.sent is again


def test_a_send_lets_no_hop_hold_its_session_past_what_the_deadline_leaves() -> None:
    params = chat()
    began = time.time()

    request = head_request(on_split_route(params), params=params, request_id="r", lasts=3.0)

    assert began < request.ends_at <= time.time() + 3.0 + 1
    assert request.expires_at <= time.time() + settings.MESHNET_PLAN_VALIDITY + 1


def test_a_text_prompt_is_sent_as_text_and_scored_only_when_echoed_with_logprobs() -> None:
    plain = text()
    scored = text(echo=True, logprobs=2)

    request = head_request(on_split_route(plain), params=plain, request_id="r")
    echoed = head_request(on_split_route(scored), params=scored, request_id="r")

    assert (request.prompt, request.messages, request.echo) == ("Once upon a time", [], False)
    assert (echoed.echo, echoed.logprobs, echoed.top_logprobs) == (True, True, 2)


def test_a_send_may_resume_from_tokens_already_produced() -> None:
    params = chat()

    request = head_request(
        on_split_route(params), params=params, request_id="r", resume_token_ids=(4, 5, 6)
    )

    assert request.resume_token_ids == [4, 5, 6]
    assert request.max_tokens == 7  # the resumed tokens are inside the budget


def test_a_head_may_stay_silent_a_step_limit_per_hop_and_one_more() -> None:
    step = step_time_limit(2.0, 40)

    assert silence_limit(step_timeout=2.0, hops=2, positions=40) == 3 * step
    echoed = silence_limit(step_timeout=2.0, hops=2, positions=40, echo=True)
    assert echoed == 2 * step + step_time_limit(2.0, 40, echo=True)


def test_a_node_that_cannot_follow_the_grammar_is_not_blamed() -> None:
    assert HopFailure("t", "node t failed (bad_grammar)", code=BAD_GRAMMAR).grammar_unfollowed
    assert not HopFailure("t", "node t failed (hop_failed)", code="hop_failed").grammar_unfollowed
