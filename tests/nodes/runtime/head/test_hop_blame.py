"""Whom a head blames: the node that produced what another node refuses, never the client.

Tensors are checked finite where they arrive and where the head receives
them; token ids from the tail are checked on the head; a hop refuses
sampling out of range with a 400, not a crash. Nodes run in process (the
tiny model), called directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.loading.tiny import tiny_tokenizer
from nodes_app.runtime.server import create_app
from nodes_app.runtime.wire.entries import step_fields
from nodes_app.runtime.wire.tensors import tensor_to_bytes
from nodes_app.shared.prompting import prompt_token_ids
from nodes_app.shared.sources import resolve_source
from tests.support.fake_hop import fake_hop
from tests.support.hidden_states import nan_hidden
from tests.support.link import HIDDEN, in_process_link, tiny_step
from tests.support.nodes import TINY
from tests.support.sse import sse_frames

PROMPT = [{"role": "user", "content": "Tell me about meshes."}]
VOCAB = 259  # the tiny model's


def tiny_service(start: int, end: int, node_id: str) -> NodeService:
    torch.set_num_threads(1)
    shard = load_shard(
        model_key=TINY, source=resolve_source(TINY), start=start, end=end, progress=False
    )
    # Dev-open: these tests call nodes directly, unsigned (test_trust*.py hold the
    # signed-plan checks; the real processes below are registered and closed).
    return NodeService(shard, node_id=node_id, gate=PlanGate(dev_open=True))


@pytest.fixture(scope="module")
def tail() -> Iterator[TestClient]:
    with TestClient(create_app(tiny_service(2, 3, "tail"))) as client:
        yield client


@pytest.fixture(scope="module")
def head() -> Iterator[TestClient]:
    with TestClient(create_app(tiny_service(0, 1, "head"))) as client:
        yield client


def test_nan_hidden_states_are_a_400_naming_their_producer_and_the_hop_keeps_serving(
    tail: TestClient,
) -> None:
    with in_process_link(tail) as link:
        refusal = link.step(tiny_step("nan", 3, sender="node-upstream"), nan_hidden(3))

        assert refusal.status == 400
        assert refusal.code == "non_finite_input"
        assert "node-upstream" in refusal.message
        assert tail.get("/v1/health").json()["cached_sessions"] == 0
        good = torch.randn(1, 3, HIDDEN)
        answer = link.step(tiny_step("ok", 3), tensor_to_bytes(good))
        assert answer.status == 200 and isinstance(answer.token_id, int)
        link.cancel("ok")


@pytest.mark.parametrize(
    "sampling", [{"seed": 2**64}, {"top_p": 1e-46, "temperature": 1.0}, {"temperature": 1e9}]
)
def test_a_hop_refuses_sampling_out_of_range_with_a_400_not_a_crash(
    tail: TestClient, sampling: dict[str, Any]
) -> None:
    fields = {**step_fields(tiny_step("s", 2)), "sampling": sampling}

    with in_process_link(tail) as link:
        answer = link.raw_step(fields, tensor_to_bytes(torch.randn(1, 2, HIDDEN)))

    assert answer.status == 400
    assert answer.code == "bad_sampling"


def generate_through(head: TestClient, hops: list[dict[str, Any]]) -> list[Any]:
    body = {
        "request_id": "blame",
        "messages": PROMPT,
        "max_tokens": 4,
        "temperature": 0.0,
        "plan": {"model": TINY, "hops": hops},
    }
    response = head.post("/v1/generate", json=body)
    assert response.status_code == 200, response.text
    return sse_frames(response.text.splitlines())


def head_hop(end: int = 1) -> dict[str, Any]:
    return {"node_id": "head", "endpoint": "http://testserver", "start_layer": 0, "end_layer": end}


def fake(node_id: str, url: str, start: int, end: int) -> dict[str, Any]:
    return {"node_id": node_id, "endpoint": url, "start_layer": start, "end_layer": end}


def blamed(frames: list[Any]) -> tuple[str, str]:
    error = frames[-2]["error"]
    assert frames[-1] == "[DONE]"
    return error["node_id"], error["code"]


@pytest.mark.parametrize("token", [VOCAB, 10**12, -1, True, 2.5, "7"])
def test_a_token_id_outside_the_vocabulary_is_the_tails_fault_not_the_heads(
    head: TestClient, token: Any
) -> None:
    with fake_hop({"token_id": token}) as url:
        frames = generate_through(head, [head_hop(), fake("liar-tail", url, 2, 3)])

    assert blamed(frames) == ("liar-tail", "hop_failed")
    assert "token id" in frames[-2]["error"]["message"]


def test_a_middle_hop_answering_the_wrong_shape_is_that_hops_fault(head: TestClient) -> None:
    one_row = {"dtype": "float32", "shape": [1, 1, HIDDEN]}  # the prefill has many
    with fake_hop(one_row, tensor_to_bytes(torch.randn(1, 1, HIDDEN))) as url:
        frames = generate_through(
            head, [head_hop(), fake("odd-middle", url, 2, 2), fake("tail", url, 3, 3)]
        )

    assert blamed(frames) == ("odd-middle", "hop_failed")


def test_a_hop_refusing_non_finite_input_blames_the_node_that_computed_it(
    head: TestClient,
) -> None:
    refusal = {
        "status": 400,
        "message": "x",
        "type": "invalid_request_error",
        "code": "non_finite_input",
    }
    with fake_hop(refusal) as url:
        frames = generate_through(head, [head_hop(), fake("judging-tail", url, 2, 3)])

    # The head computed what the tail refused: the head is named.
    assert blamed(frames) == ("head", "hop_failed")


def test_a_hop_answer_with_nan_in_it_is_never_relayed(head: TestClient) -> None:
    prompt_rows = len(prompt_token_ids(tiny_tokenizer(), PROMPT))
    nan = nan_hidden(prompt_rows)
    answer = {"dtype": "float32", "shape": [1, prompt_rows, HIDDEN]}
    with fake_hop(answer, nan) as middle, fake_hop({"token_id": 1}) as tail_url:
        frames = generate_through(
            head, [head_hop(), fake("nan-middle", middle, 2, 2), fake("tail", tail_url, 3, 3)]
        )

    assert blamed(frames) == ("nan-middle", "hop_failed")
    assert "not finite" in frames[-2]["error"]["message"]
