"""The prefix scope every plan carries (ADR-0027, "Tracker"): a key reuses only its own
cached prefixes unless the model's operator lets keys share them."""

from __future__ import annotations

import json

from django.test import override_settings

from nodes_app.plans import tracker_public_key
from nodes_app.protocol.limits import PREFIX_MAX_SCOPE
from nodes_app.shared.signing import public_key_from_hex, verify_plan
from routing_app.policies.choice import DecisionMode, RouteDecision
from tests.support.probe_answers import SPLIT
from tracker_app.completions.chat_request import chat_params_parse
from tracker_app.completions.failover import replay_request
from tracker_app.completions.generation import Generation, Segment
from tracker_app.completions.head_stream import head_request
from tracker_app.completions.prefix_scope import prefix_scope
from tracker_app.completions.prompt_tokens import PromptCount


def test_a_keys_scope_is_stable_and_its_own() -> None:
    first = prefix_scope(api_key_id=7, model_key="tiny", shared=False)

    assert first == prefix_scope(api_key_id=7, model_key="tiny", shared=False)
    assert first != prefix_scope(api_key_id=8, model_key="tiny", shared=False)
    # The key's, not the model's: a key reuses its own prefixes of any model (the
    # nodes' keys add the model, range and precision anyway).
    assert first == prefix_scope(api_key_id=7, model_key="other", shared=False)
    assert first.startswith("key:") and len(first) == len("key:") + 32
    assert len(first) <= PREFIX_MAX_SCOPE


def test_a_keys_scope_reveals_nothing_without_the_deployments_secret() -> None:
    here = prefix_scope(api_key_id=7, model_key="tiny", shared=False)

    with override_settings(SECRET_KEY="another deployment's secret"):
        elsewhere = prefix_scope(api_key_id=7, model_key="tiny", shared=False)

    assert here != elsewhere  # keyed by the secret: no one without it can map ids to scopes


def test_a_shared_model_is_one_scope_for_every_key() -> None:
    shared = prefix_scope(api_key_id=7, model_key="tiny", shared=True)

    assert shared == "shared:tiny"
    assert shared == prefix_scope(api_key_id=8, model_key="tiny", shared=True)
    assert shared != prefix_scope(api_key_id=7, model_key="tiny", shared=False)


def test_every_send_of_a_choice_carries_its_scope_signed_by_the_tracker() -> None:
    scope = prefix_scope(api_key_id=7, model_key="tiny", shared=False)
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 7}
    params = chat_params_parse(json.dumps(body).encode())
    generation = Generation(
        choice=0,
        prompt=params.prompt_of(0),
        prompt_count=PromptCount(5, True),
        sampling=params.sampling(0),
        prefix_scope=scope,
    )
    generation.segments.append(Segment(RouteDecision(SPLIT, DecisionMode.PINNED, 1), 0, 0.0))

    first = head_request(generation, params=params, request_id="r")
    generation.token_ids = [1, 2]
    replay = replay_request(generation, params=params, request_id="r")

    key = public_key_from_hex(tracker_public_key())
    for request in (first, replay):
        assert request.plan.prefix_scope == scope
        assert request.to_json()["plan"]["prefix_scope"] == scope
        assert request.plan.signed_fields()["prefix_scope"] == scope
        assert verify_plan(key, request.plan.signed_fields(), request.signature)
