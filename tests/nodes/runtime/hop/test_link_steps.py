"""Hop steps on the link (``/v1/link``) in process: good steps, batches, every bad input."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.sampler import SamplingParams
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.server import create_app
from nodes_app.runtime.wire.entries import ForwardStep, LinkStep, StepAnswer, step_fields
from nodes_app.runtime.wire.tensors import tensor_to_bytes
from nodes_app.shared.sources import resolve_source
from tests.support.link import HIDDEN, LinkClient, in_process_link, tiny_step

MAX_FRAME_BYTES = 256 * 1024


def hidden_bytes(rows: int, seed: int = 0) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    return tensor_to_bytes(torch.randn(1, rows, HIDDEN, generator=generator))


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    """A tail node (layers 1-3 of the tiny model) served in process, dev-open (the
    signed-plan checks are in test_signed_plans_processes.py)."""
    torch.set_num_threads(1)
    shard = load_shard(
        model_key="tiny-random-llama",
        source=resolve_source("tiny-random-llama"),
        start=1,
        end=3,
        progress=False,
    )
    service = NodeService(shard, node_id="in-process", gate=PlanGate(dev_open=True))
    with TestClient(create_app(service, max_frame_bytes=MAX_FRAME_BYTES)) as test_client:
        yield test_client


@pytest.fixture
def link(client: TestClient) -> Iterator[LinkClient]:
    with in_process_link(client) as opened:
        yield opened


def test_a_prefill_then_decode_steps_return_tokens(link: LinkClient) -> None:
    first = link.step(tiny_step("a", 5), hidden_bytes(5))
    assert first.status == 200
    assert isinstance(first.token_id, int)
    step = link.step(tiny_step("a", 1, position=5), hidden_bytes(1))
    assert step.status == 200
    assert link.cancel("a").status == 204


def test_a_middle_hop_returns_hidden_states_in_the_wire_format(link: LinkClient) -> None:
    answer = link.step(tiny_step("mid", 4, end=2), hidden_bytes(4))
    assert answer.status == 200
    assert answer.dtype == "float32"
    assert answer.shape == (1, 4, HIDDEN)
    assert answer.hidden is not None and len(answer.hidden) == 4 * HIDDEN * 4
    link.cancel("mid")


def test_a_batch_frame_of_several_sessions_is_answered_per_session(
    client: TestClient, link: LinkClient
) -> None:
    sessions = [f"batch-{i}" for i in range(4)]
    prefill = [
        LinkStep(link.next_id(), tiny_step(s, 3), hidden_bytes(3, seed=i))
        for i, s in enumerate(sessions)
    ]
    first = link.exchange(prefill)
    decode = [
        LinkStep(link.next_id(), tiny_step(s, 1, position=3), hidden_bytes(1, seed=i))
        for i, s in enumerate(sessions)
    ]
    second = link.exchange(decode)

    assert [a.status for a in first + second] == [200] * 8
    assert all(isinstance(a.token_id, int) for a in first + second)
    # Each session ran alone what it runs in the batch: the same token as a lone step.
    alone = link.step(tiny_step("alone", 3), hidden_bytes(3, seed=2))
    assert alone.token_id == first[2].token_id
    assert client.get("/v1/health").json()["cached_sessions"] == 5
    for session in [*sessions, "alone"]:
        assert link.cancel(session).status == 204


def test_one_bad_step_in_a_frame_fails_only_itself(client: TestClient, link: LinkClient) -> None:
    good = LinkStep(link.next_id(), tiny_step("good", 2), hidden_bytes(2))
    short = LinkStep(link.next_id(), tiny_step("short", 3), hidden_bytes(2))
    unknown = LinkStep(link.next_id(), tiny_step("gone", 1, position=9), hidden_bytes(1))
    other = LinkStep(link.next_id(), tiny_step("other", 1, end=2), hidden_bytes(1))

    answers = link.exchange([good, short, unknown, other])

    assert [(a.status, a.code) for a in answers] == [
        (200, None),
        (400, "bad_length"),
        (400, "unknown_session"),
        (200, None),
    ]
    assert client.get("/v1/health").json()["cached_sessions"] == 2
    link.cancel("good")
    link.cancel("other")


BAD_STEPS = [
    (tiny_step("x", 3, dtype="float16"), hidden_bytes(1), "bad_length"),
    (tiny_step("x", 3), hidden_bytes(2), "bad_length"),
    (tiny_step("x", 1, position=7), hidden_bytes(1), "unknown_session"),
    (tiny_step("x", 2, position=4095), hidden_bytes(2), "context_length_exceeded"),
    (tiny_step("x", 2, start=0), hidden_bytes(2), "layers_out_of_range"),
    (tiny_step("x", 2, start=2, end=4), hidden_bytes(2), "layers_out_of_range"),
    # A logit_bias or a token id past the vocabulary of 259; scores asked of a middle hop.
    (
        replace(tiny_step("x", 2), sampling=SamplingParams(logit_bias=((259, 1.0),))),
        hidden_bytes(2),
        "bad_sampling",
    ),
    (replace(tiny_step("x", 2), prompt_ids=(257, 259)), hidden_bytes(2), "bad_field"),
    (replace(tiny_step("x", 2), generated_ids=(300,)), hidden_bytes(2), "bad_field"),
    (replace(tiny_step("x", 2, end=2), logprobs=1), hidden_bytes(2), "bad_field"),
]
BAD_FIELDS = [
    ({"dtype": "int8"}, hidden_bytes(2), "bad_dtype"),
    ({"shape": [1, 2, 63]}, hidden_bytes(2), "bad_shape"),
    ({"shape": [2, "x"]}, hidden_bytes(2), "bad_shape"),
    ({"end": None}, hidden_bytes(2), "missing_field"),
]


def assert_refused_and_still_serving(
    client: TestClient, link: LinkClient, answer: StepAnswer, code: str
) -> None:
    assert answer.status == 400
    assert answer.code == code
    assert answer.error_type == "invalid_request_error"
    assert answer.message
    health = client.get("/v1/health").json()
    assert health["status"] == "ok"
    assert health["cached_sessions"] == 0
    good = link.step(tiny_step("ok", 1), hidden_bytes(1))
    assert good.status == 200
    link.cancel("ok")


@pytest.mark.parametrize(("step", "body", "code"), BAD_STEPS)
def test_bad_input_is_refused_with_400_and_the_node_keeps_serving(
    client: TestClient, link: LinkClient, step: ForwardStep, body: bytes, code: str
) -> None:
    assert_refused_and_still_serving(client, link, link.step(step, body), code)


@pytest.mark.parametrize(("changes", "body", "code"), BAD_FIELDS)
def test_malformed_step_fields_are_refused_with_400_and_the_node_keeps_serving(
    client: TestClient, link: LinkClient, changes: dict[str, object], body: bytes, code: str
) -> None:
    fields = {**step_fields(tiny_step("x", 2)), **changes}
    assert_refused_and_still_serving(client, link, link.raw_step(fields, body), code)


def test_the_tail_keeps_the_sampling_its_session_opened_with(link: LinkClient) -> None:
    unsampled = replace(tiny_step("kept", 2), sampling=None)
    opening = link.step(unsampled, hidden_bytes(2))
    assert (opening.status, opening.code) == (400, "missing_field")
    banned = SamplingParams(logit_bias=((65, 100.0),))
    assert link.step(replace(tiny_step("kept", 2), sampling=banned), hidden_bytes(2)).token_id == 65

    later = link.step(replace(tiny_step("kept", 1, position=2), sampling=None), hidden_bytes(1))

    assert (later.status, later.token_id) == (200, 65)  # the bias of the opening step
    link.cancel("kept")


@pytest.mark.parametrize("field", ["prompt_ids", "generated_ids"])
def test_an_echo_or_resumed_tokens_on_a_later_step_are_refused(
    link: LinkClient, field: str
) -> None:
    assert link.step(tiny_step("later", 2), hidden_bytes(2)).status == 200
    resumed: dict[str, Any] = {field: (65,)}
    later = replace(tiny_step("later", 1, position=2), **resumed)

    answer = link.step(later, hidden_bytes(1))

    assert (answer.status, answer.code) == (400, "bad_field")
    assert "opens the session" in answer.message
    link.cancel("later")


def test_hidden_states_in_another_float_dtype_are_cast_on_arrival(link: LinkClient) -> None:
    # A GPU head in float16 handing over to this float32 node (ADR-0020's topology).
    half = torch.randn(1, 3, HIDDEN, generator=torch.Generator().manual_seed(3)).half()

    answer = link.step(tiny_step("half", 3, dtype="float16"), tensor_to_bytes(half))

    assert answer.status == 200, answer.message
    assert isinstance(answer.token_id, int)
    link.cancel("half")


def test_a_step_at_the_wrong_position_is_refused(link: LinkClient) -> None:
    link.step(tiny_step("p", 3), hidden_bytes(3))
    skipped = link.step(tiny_step("p", 1, position=4), hidden_bytes(1))
    assert skipped.status == 400
    assert skipped.code == "position_mismatch"
    link.cancel("p")


def test_cancelling_an_unknown_session_is_404(link: LinkClient) -> None:
    answer = link.cancel("never")
    assert answer.status == 404
    assert answer.code == "unknown_session"


def test_a_frame_that_is_not_one_closes_the_link_and_the_node_keeps_serving(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with in_process_link(client) as link, pytest.raises(WebSocketDisconnect) as closed:
        link.send_frame(b"\x05\x00\x00\x00nope!")
        link.answers([1])

    assert closed.value.code == 1007
    assert "link from" in caplog.text and "not JSON" in caplog.text
    with in_process_link(client) as fresh:
        assert fresh.step(tiny_step("after", 1), hidden_bytes(1)).status == 200
        fresh.cancel("after")


def test_a_frame_over_the_size_limit_is_refused(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    rows = MAX_FRAME_BYTES // (HIDDEN * 4) + 1
    with in_process_link(client) as link, pytest.raises(WebSocketDisconnect) as closed:
        link.step(tiny_step("huge", rows), hidden_bytes(rows))

    assert closed.value.code == 1009
    assert f"a frame over {MAX_FRAME_BYTES} bytes" in caplog.text
    assert client.get("/v1/health").json()["cached_sessions"] == 0
