"""The head's own checks of a generate request: is it hop 0 of a plan it can run?"""

from __future__ import annotations

from typing import Any

import pytest

from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.signed_plan import PlanHop
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.head.request_checks import HeadIdentity, parse_generate_request

# A partial head of a 4-layer model: it serves layers 0-2.
HEAD = HeadIdentity(
    node_id="head",
    model_key="tiny-random-llama",
    shard_start=0,
    shard_end=2,
    num_layers=4,
    vocab_size=259,
)


def body(*hops: tuple[str, int, int], **changes: Any) -> dict[str, Any]:
    request = GenerateRequest(
        request_id="req-1",
        model="tiny-random-llama",
        hops=tuple(PlanHop(node, f"http://{node}:7000", start, end) for node, start, end in hops),
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
    )
    return {**request.to_json(), **changes}


def refused(raw: Any) -> RuntimeRequestError:
    with pytest.raises(RuntimeRequestError) as caught:
        parse_generate_request(raw, HEAD)
    assert caught.value.status == 400
    return caught.value


def test_a_plan_this_head_can_run_is_accepted() -> None:
    request = parse_generate_request(body(("head", 0, 1), ("tail", 2, 3)), HEAD)

    assert [hop.node_id for hop in request.hops] == ["head", "tail"]


def test_the_head_may_run_fewer_layers_than_it_holds() -> None:
    request = parse_generate_request(body(("head", 0, 0), ("rest", 1, 3)), HEAD)

    assert request.hops[0].end_layer == 0


def test_a_plan_for_another_node_is_refused_as_not_head() -> None:
    error = refused(body(("someone-else", 0, 1), ("tail", 2, 3)))
    assert error.code == "not_head"
    assert "someone-else" in error.message


def test_a_plan_for_another_model_is_refused() -> None:
    raw = body(("head", 0, 1), ("tail", 2, 3))
    raw["plan"]["model"] = "smollm2-135m"
    assert refused(raw).code == "wrong_model"


def test_hop_zero_past_this_heads_shard_is_refused() -> None:
    error = refused(body(("head", 0, 3)))
    assert error.code == "invalid_plan"
    assert "e <= 2" in error.message


def test_a_plan_that_stops_short_of_the_last_layer_is_refused() -> None:
    error = refused(body(("head", 0, 1), ("tail", 2, 2)))
    assert error.code == "invalid_plan"
    assert "layer 3" in error.message


def test_resumed_tokens_outside_the_vocabulary_are_refused() -> None:
    error = refused(body(("head", 0, 1), ("tail", 2, 3), resume_token_ids=[5, 259]))
    assert error.code == "invalid_request"
    assert "259" in error.message


def test_protocol_errors_reach_the_client_as_the_nodes_400_with_their_code() -> None:
    assert refused(body(("head", 0, 1), ("tail", 2, 3), temperature=-1)).code == "bad_sampling"
    assert refused(body(("head", 0, 1), ("tail", 3, 3))).code == "invalid_plan"
    assert refused("not an object").as_json()["error"]["type"] == "invalid_request_error"
