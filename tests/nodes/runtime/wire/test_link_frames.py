"""The hop link's frames: steps and answers to bytes and back, and the steps a node refuses."""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

import pytest
import torch

from nodes_app.protocol.limits import MAX_SESSION_ID
from nodes_app.runtime.engine.sampler import SamplingParams
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.wire.entries import (
    MAX_FRAME_ENTRIES,
    CancelEntry,
    ForwardStep,
    FrameError,
    LinkStep,
    RefusedEntry,
    StepAnswer,
    step_fields,
    step_from_fields,
)
from nodes_app.runtime.wire.frames import (
    decode_answers,
    decode_requests,
    encode_answers,
    encode_requests,
)
from nodes_app.runtime.wire.tensors import DTYPES, body_length, tensor_from_bytes, tensor_to_bytes

STEP = ForwardStep(
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
    drafts=(6, 7),
)


def raw_frame(entries: list[dict[str, Any]], bodies: bytes = b"") -> bytes:
    """A frame written by hand, as an untrusted head could send it."""
    header = json.dumps({"steps": entries}).encode()
    return struct.pack("<I", len(header)) + header + bodies


def refused(fields: dict[str, Any]) -> RuntimeRequestError:
    [entry] = decode_requests(raw_frame([{"id": 1, "step": fields}]))
    assert isinstance(entry, RefusedEntry)
    assert entry.error.status == 400
    return entry.error


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_tensor_survives_the_trip_through_bytes(dtype: str) -> None:
    tensor = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(1)).to(DTYPES[dtype])
    step = dataclasses.replace(STEP, dtype=dtype)
    body = tensor_to_bytes(tensor)

    assert len(body) == body_length(step) == 3 * 8 * tensor.element_size()
    back = tensor_from_bytes(body, dtype, step.shape)
    assert back.dtype == tensor.dtype
    assert torch.equal(back, tensor)


def test_a_frame_carries_every_step_field_its_credentials_and_its_bytes() -> None:
    first = LinkStep(1, STEP, b"a" * 96, capability="c" * 64, plan="signed-plan")
    second = LinkStep(2, dataclasses.replace(STEP, session_id="s-2", sampling=None), b"b" * 96)
    cancel = CancelEntry(3, "s-3", capability="d" * 64)

    decoded = decode_requests(encode_requests([first, second, cancel]))

    assert decoded == [first, second, cancel]


def test_answers_carry_hidden_states_tokens_and_refusals() -> None:
    answers = [
        StepAnswer(1, hidden=b"h" * 32, dtype="float16", shape=(1, 2, 8)),
        StepAnswer(2, token_id=42),
        StepAnswer.refusal(
            3, RuntimeRequestError("full", code="node_busy", status=503, error_type="server_error")
        ),
    ]

    decoded = decode_answers(encode_answers(answers))

    assert decoded == answers
    assert decoded[2].message == "full"


def test_every_field_of_a_step_travels_by_name() -> None:
    # Generic on purpose: a field added to ForwardStep needs no change in the codec.
    names = {field.name for field in dataclasses.fields(ForwardStep)}

    assert set(step_fields(STEP)) == names
    assert step_from_fields(json.loads(json.dumps(step_fields(STEP)))) == STEP


def test_a_body_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(RuntimeRequestError) as caught:
        tensor_from_bytes(bytes(4 * 8 * 3 - 1), "float32", (1, 3, 8))
    assert caught.value.code == "bad_length"


GOOD = step_fields(STEP)


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
        ({"drafts": [5, 6, 7]}, "bad_field"),  # a round's drafts follow its first position
        ({"drafts": []}, "bad_field"),
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
        raw_frame([{"id": 1}] * (MAX_FRAME_ENTRIES + 1)),
    ],
)
def test_a_frame_that_is_not_one_is_refused_whole(frame: bytes) -> None:
    with pytest.raises(FrameError):
        decode_requests(frame)


# --- the compact form: a decode step's frame and a last hop's tokens -------------------

STEADY = dataclasses.replace(
    STEP,
    shape=(1, 1, 8),
    position=9,
    sampling=None,
    reserve=None,
    logprobs=None,
    prompt_ids=None,
    generated_ids=None,
    token_ids=None,
    drafts=None,
)


def test_steady_steps_and_token_answers_travel_compact_and_arrive_whole() -> None:
    steps = [
        LinkStep(1, STEADY, b"a" * 32, capability="c" * 64),
        LinkStep(2, dataclasses.replace(STEADY, sender=None, logprobs=2), b"b" * 32),
    ]
    answers = [
        StepAnswer(1, token_id=42),
        StepAnswer(2, hidden=b"h" * 16, dtype="bfloat16", shape=(1, 1, 8)),
    ]

    step_frame, answer_frame = encode_requests(steps), encode_answers(answers)

    assert step_frame.startswith(b"\0\0\0\0") and answer_frame.startswith(b"\0\0\0\0")
    assert decode_requests(step_frame) == steps
    assert decode_answers(answer_frame) == answers


@pytest.mark.parametrize(
    "entries",
    [
        [LinkStep(1, STEP, b"a" * 96, capability="c" * 64, plan="signed-plan")],
        [LinkStep(1, STEADY, b"a" * 32), CancelEntry(2, "s-3")],
        [LinkStep(1, dataclasses.replace(STEADY, reserve=64), b"a" * 32)],
        [LinkStep(1, dataclasses.replace(STEADY, session_id="é" * 128), b"a" * 32)],
    ],
)
def test_an_opening_a_cancel_or_a_field_the_compact_form_lacks_goes_as_json(
    entries: list[LinkStep | CancelEntry],
) -> None:
    frame = encode_requests(entries)

    assert not frame.startswith(b"\0\0\0\0")
    assert decode_requests(frame) == entries


def test_answers_with_scores_or_refusals_go_as_json() -> None:
    scored = StepAnswer(1, token_id=3, logprob=-0.5, top=[[3, -0.5]])
    refusal = StepAnswer.refusal(2, RuntimeRequestError("no", code="bad_field"))

    for answer in (scored, refusal):
        frame = encode_answers([answer])
        assert not frame.startswith(b"\0\0\0\0")
        assert decode_answers(frame) == [answer]


def compact_step(
    *, dtype: int = 1, rows: int = 1, flags: int = 0, logprobs: int = 0, session: bytes = b"s-1"
) -> bytes:
    """A compact step frame written by hand (one entry of 4 body bytes)."""
    entry = struct.pack("<IIIIIIIBBB", 7, 4, 0, 1, 5, rows, 1, dtype, flags, logprobs)
    entry += bytes((len(session),)) + session
    header = struct.pack("<BH", 1, 1) + entry
    return struct.pack("<II", 0, len(header)) + header + b"abcd"


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (compact_step(dtype=9), "bad_dtype"),
        (compact_step(rows=0), "bad_shape"),
        (compact_step(flags=4, logprobs=21), "bad_field"),
        (compact_step(session=b""), "missing_field"),
        (compact_step(session=b"s" * (MAX_SESSION_ID + 1)), "bad_field"),
    ],
)
def test_a_compact_step_with_a_bad_field_is_refused_alone_with_its_code(
    frame: bytes, code: str
) -> None:
    [entry] = decode_requests(frame)

    assert isinstance(entry, RefusedEntry)
    assert (entry.step_id, entry.error.code) == (7, code)


@pytest.mark.parametrize(
    "frame",
    [
        b"\0\0\0\0",
        struct.pack("<II", 0, 99) + b"\x01\x01\x00",
        compact_step()[:-1],  # a body short
        compact_step() + b"e",  # bytes no entry declares
        compact_step(flags=1),  # a sender the header does not hold
        compact_step(session=b"\xff\xfe"),  # not UTF-8
        # a header with bytes past its entries
        struct.pack("<II", 0, 4) + struct.pack("<BH", 1, 0) + b"x",
        # answers where steps belong
        encode_answers([StepAnswer(1, token_id=2)]),
        struct.pack("<IIBH", 0, 3, 1, MAX_FRAME_ENTRIES + 1),
    ],
)
def test_a_compact_frame_that_is_not_one_is_refused_whole(frame: bytes) -> None:
    with pytest.raises(FrameError):
        decode_requests(frame)


def test_a_compact_header_over_the_bound_is_refused_before_it_is_read() -> None:
    frame = compact_step()

    with pytest.raises(FrameError, match="over the"):
        decode_requests(frame, max_header=8)


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack("<IIBH", 0, 3, 2, 1),  # an entry the header does not hold
        struct.pack("<IIBH", 0, 21, 2, 1) + struct.pack("<BIIBII", 9, 1, 0, 0, 0, 0),
        struct.pack("<IIBH", 0, 21, 2, 1) + struct.pack("<BIIBII", 2, 1, 8, 1, 1, 2),
        encode_requests([LinkStep(1, STEADY, b"a" * 32)]),
    ],
)
def test_a_compact_answer_frame_that_is_not_one_is_refused_whole(frame: bytes) -> None:
    with pytest.raises(FrameError):
        decode_answers(frame)
