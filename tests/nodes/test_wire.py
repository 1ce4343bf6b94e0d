"""The hop link's frames: steps and answers to bytes and back, and the steps a node refuses."""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

import pytest
import torch

from nodes_app.protocol.limits import MAX_SESSION_ID
from nodes_app.runtime import wire
from nodes_app.runtime.errors import RuntimeRequestError
from nodes_app.runtime.sampling import SamplingParams

STEP = wire.ForwardStep(
    session_id="s-1",
    start=2,
    end=3,
    position=0,
    dtype="float32",
    shape=(1, 3, 8),
    sampling=SamplingParams(
        temperature=0.5, seed=9, frequency_penalty=0.5, logit_bias=((7, -100.0), (12, 2.5))
    ),
    sender="node-head",
    reserve=64,
    logprobs=3,
    prompt_ids=(5, 6, 7),
    generated_ids=(7,),
    token_ids=(5, 6, 7),
)


def raw_frame(entries: list[dict[str, Any]], bodies: bytes = b"") -> bytes:
    """A frame written by hand, as an untrusted head could send it."""
    header = json.dumps({"steps": entries}).encode()
    return struct.pack("<I", len(header)) + header + bodies


def refused(fields: dict[str, Any]) -> RuntimeRequestError:
    [entry] = wire.decode_requests(raw_frame([{"id": 1, "step": fields}]))
    assert isinstance(entry, wire.RefusedEntry)
    assert entry.error.status == 400
    return entry.error


@pytest.mark.parametrize("dtype", sorted(wire.DTYPES))
def test_a_tensor_survives_the_trip_through_bytes(dtype: str) -> None:
    tensor = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(1)).to(wire.DTYPES[dtype])
    step = dataclasses.replace(STEP, dtype=dtype)
    body = wire.tensor_to_bytes(tensor)

    assert len(body) == wire.body_length(step) == 3 * 8 * tensor.element_size()
    back = wire.tensor_from_bytes(body, dtype, step.shape)
    assert back.dtype == tensor.dtype
    assert torch.equal(back, tensor)


def test_a_frame_carries_every_step_field_its_credentials_and_its_bytes() -> None:
    first = wire.LinkStep(1, STEP, b"a" * 96, capability="c" * 64, plan="signed-plan")
    second = wire.LinkStep(2, dataclasses.replace(STEP, session_id="s-2", sampling=None), b"b" * 96)
    cancel = wire.CancelEntry(3, "s-3", capability="d" * 64)

    decoded = wire.decode_requests(wire.encode_requests([first, second, cancel]))

    assert decoded == [first, second, cancel]


def test_answers_carry_hidden_states_tokens_and_refusals() -> None:
    answers = [
        wire.StepAnswer(1, hidden=b"h" * 32, dtype="float16", shape=(1, 2, 8)),
        wire.StepAnswer(2, token_id=42),
        wire.StepAnswer.refusal(
            3, RuntimeRequestError("full", code="node_busy", status=503, error_type="server_error")
        ),
    ]

    decoded = wire.decode_answers(wire.encode_answers(answers))

    assert decoded == answers
    assert decoded[2].message == "full"


def test_every_field_of_a_step_travels_by_name() -> None:
    # Generic on purpose: a field added to ForwardStep needs no change in the codec.
    names = {field.name for field in dataclasses.fields(wire.ForwardStep)}

    assert set(wire.step_fields(STEP)) == names
    assert wire.step_from_fields(json.loads(json.dumps(wire.step_fields(STEP)))) == STEP


def test_a_body_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(RuntimeRequestError) as caught:
        wire.tensor_from_bytes(bytes(4 * 8 * 3 - 1), "float32", (1, 3, 8))
    assert caught.value.code == "bad_length"


GOOD = wire.step_fields(STEP)


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"dtype": "int8"}, "bad_dtype"),
        ({"shape": [1, 3]}, "bad_shape"),
        ({"shape": [2, 3, 8]}, "bad_shape"),
        ({"shape": [1, 0, 8]}, "bad_shape"),
        ({"shape": [1, "x", 8]}, "bad_shape"),
        ({"position": -1}, "bad_field"),
        ({"start": "two"}, "bad_field"),
        ({"start": True}, "bad_field"),
        ({"session_id": "s" * (MAX_SESSION_ID + 1)}, "bad_field"),
        ({"surprise": 1}, "bad_field"),
        ({"end": None}, "missing_field"),
        ({"session_id": ""}, "missing_field"),
        ({"sampling": "{not an object"}, "bad_sampling"),
        ({"sampling": {"top_p": 2}}, "bad_sampling"),
        ({"sampling": {"presence_penalty": 2.5}}, "bad_sampling"),
        ({"sampling": {"logit_bias": {"5": 101}}}, "bad_sampling"),
        ({"logprobs": 21}, "bad_field"),
        ({"logprobs": -1}, "bad_field"),
        ({"prompt_ids": [1, 2, 3, 4]}, "bad_field"),  # more ids than the step's 3 positions
        ({"prompt_ids": [1, -2]}, "bad_field"),
        ({"generated_ids": "1,2"}, "bad_field"),
        # An echo answering more logprobs than a head may ask for (ECHO_MAX_SCORES).
        (
            {"shape": [1, 20_000, 8], "prompt_ids": [1] * 20_000, "logprobs": 20},
            "bad_field",
        ),
    ],
)
def test_bad_step_fields_are_refused_with_their_code(changes: dict[str, Any], code: str) -> None:
    assert refused({**GOOD, **changes}).code == code


@pytest.mark.parametrize(
    "frame",
    [
        b"\x01\x00",
        struct.pack("<I", 99) + b"{}",
        struct.pack("<I", 5) + b"nope!",
        raw_frame([{"step": GOOD}]),
        raw_frame([{"id": 1, "bytes": 10, "step": GOOD}], b"short"),
        raw_frame([{"id": 1, "bytes": 2, "step": GOOD}], b"three"),
        raw_frame([{"id": 1}] * (wire.MAX_FRAME_ENTRIES + 1)),
    ],
)
def test_a_frame_that_is_not_one_is_refused_whole(frame: bytes) -> None:
    with pytest.raises(wire.FrameError):
        wire.decode_requests(frame)
