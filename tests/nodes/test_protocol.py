"""The tracker↔node protocol: what one side encodes the other parses back; bad input named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes_app.protocol.errors import HOP_BUSY, ProtocolError, relayable_code
from nodes_app.protocol.frames import ChunkFrame, ErrorFrame, parse_frame
from nodes_app.protocol.generate import GenerateRequest, stop_sequences
from nodes_app.protocol.limits import (
    ECHO_STEP_TIME_FACTOR,
    MAX_STOP_LENGTH,
    MAX_STOPS,
    STEP_TIMEOUT_POSITIONS,
    TOP_LOGPROBS_MAX,
    step_time_limit,
)
from nodes_app.protocol.logprobs import TokenLogprob, TopLogprob
from nodes_app.protocol.sampling import LOGIT_BIAS_MAX_ENTRIES, SamplingParams, logit_bias_pairs
from nodes_app.protocol.signed_plan import PlanHop, capability_valid
from nodes_app.protocol.sse import SSE_DONE, sse_data, sse_event, sse_frames
from nodes_app.protocol.usage import Usage

ROOT = Path(__file__).resolve().parents[2]

REQUEST = GenerateRequest(
    request_id="req-1",
    model="tiny-random-llama",
    hops=(
        PlanHop("head", "http://head:7001", 0, 1),
        PlanHop("tail", "http://tail:7002", 2, 3),
    ),
    messages=[{"role": "user", "content": "Hello"}],
    max_tokens=32,
    sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=5),
    stop=["\n\n"],
    resume_token_ids=[1, 2, 3],
)


def body(**changes: Any) -> dict[str, Any]:
    """The request's JSON body, through a real JSON round trip, with ``changes`` applied."""
    data: dict[str, Any] = json.loads(json.dumps(REQUEST.to_json()))
    data.update(changes)
    return data


def without_messages(**changes: Any) -> dict[str, Any]:
    """The body of a raw-prompt request: ``messages`` removed, ``changes`` applied."""
    data = body(**changes)
    del data["messages"]
    return data


def refusal(raw: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        GenerateRequest.parse(raw)
    return caught.value


def test_the_module_needs_neither_django_nor_torch() -> None:
    probe = (
        "import sys, nodes_app.protocol; "
        "print(sorted(m for m in ('django', 'torch', 'httpx') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_generate_request_survives_the_trip_through_json() -> None:
    assert GenerateRequest.parse(body()) == REQUEST


def test_the_body_keeps_the_documented_shape() -> None:
    sent = body()
    assert sent["plan"] == {
        "model": "tiny-random-llama",
        "hops": [
            {"node_id": "head", "endpoint": "http://head:7001", "start_layer": 0, "end_layer": 1},
            {"node_id": "tail", "endpoint": "http://tail:7002", "start_layer": 2, "end_layer": 3},
        ],
    }
    assert {key: sent[key] for key in ("temperature", "top_p", "top_k", "seed", "stop")} == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 5,
        "stop": ["\n\n"],
    }


def test_absent_optional_fields_take_their_defaults() -> None:
    minimal = {key: body()[key] for key in ("request_id", "messages", "plan")}
    parsed = GenerateRequest.parse(minimal)
    assert (parsed.max_tokens, parsed.sampling, parsed.stop, parsed.resume_token_ids) == (
        256,
        SamplingParams(),
        [],
        [],
    )


SCORING = GenerateRequest(
    request_id="req-2",
    model="tiny-random-llama",
    hops=REQUEST.hops,
    messages=[],
    prompt="The capital of France is",
    max_tokens=0,
    sampling=SamplingParams(
        presence_penalty=-0.5, frequency_penalty=1.25, logit_bias=((3, -100.0), (17, 4.5))
    ),
    logprobs=True,
    top_logprobs=5,
    echo=True,
)


def test_a_raw_prompt_with_logprobs_echo_and_penalties_survives_the_trip_through_json() -> None:
    sent = json.loads(json.dumps(SCORING.to_json()))

    assert GenerateRequest.parse(sent) == SCORING
    assert "messages" not in sent
    assert sent["logit_bias"] == {"3": -100.0, "17": 4.5}
    assert (sent["logprobs"], sent["top_logprobs"], sent["echo"]) == (True, 5, True)


def test_a_request_using_none_of_the_new_fields_is_the_body_older_heads_know() -> None:
    assert set(body()) == {
        "request_id",
        "messages",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "resume_token_ids",
        "plan",
    }


def test_null_logprobs_fields_are_their_defaults() -> None:
    parsed = GenerateRequest.parse(body(logprobs=None, top_logprobs=None, echo=None))
    assert (parsed.logprobs, parsed.top_logprobs, parsed.echo) == (False, 0, False)


def test_max_tokens_zero_is_allowed_only_with_echo() -> None:
    assert GenerateRequest.parse(body(max_tokens=0, echo=True)).max_tokens == 0
    assert "0 only with echo" in refusal(body(max_tokens=0)).message


@given(
    st.dictionaries(
        st.integers(0, 10**9),
        st.floats(-100, 100, allow_nan=False),
        max_size=LOGIT_BIAS_MAX_ENTRIES,
    )
)
def test_any_logit_bias_in_range_survives_its_json_form(bias: dict[int, float]) -> None:
    params = SamplingParams(logit_bias=tuple(sorted(bias.items())))
    assert SamplingParams.from_mapping(json.loads(json.dumps(params.to_json()))) == params
    assert logit_bias_pairs({str(k): v for k, v in bias.items()}) == params.logit_bias


def test_a_single_stop_string_becomes_a_list_and_endpoints_lose_their_slash() -> None:
    raw = body(stop="END")
    raw["plan"]["hops"][0]["endpoint"] = "http://head:7001/"
    parsed = GenerateRequest.parse(raw)
    assert parsed.stop == ["END"]
    assert parsed.hops[0].endpoint == "http://head:7001"


@pytest.mark.parametrize(
    ("raw", "code", "words"),
    [
        ([1, 2], "invalid_request", "JSON object"),
        (body(request_id=""), "invalid_request", "request_id"),
        (body(request_id="x" * 101), "invalid_request", "request_id"),
        (body(messages=[]), "invalid_request", "messages"),
        (body(messages=[{"role": "user"}]), "invalid_request", "content"),
        (body(max_tokens=0), "invalid_request", "max_tokens"),
        (body(max_tokens=True), "invalid_request", "max_tokens"),
        (body(temperature=-1), "bad_sampling", "temperature"),
        (body(top_p=0), "bad_sampling", "top_p"),
        (body(seed="soon"), "bad_sampling", "seed"),
        (body(stop=["a"] * (MAX_STOPS + 1)), "invalid_request", f"at most {MAX_STOPS}"),
        (body(stop=["x" * (MAX_STOP_LENGTH + 1)]), "invalid_request", str(MAX_STOP_LENGTH)),
        (body(stop=[""]), "invalid_request", "non-empty"),
        (body(resume_token_ids=[1, -2]), "invalid_request", "resume_token_ids"),
        (body(plan={"model": "m", "hops": []}), "invalid_plan", "hops"),
        (body(plan={"hops": body()["plan"]["hops"]}), "invalid_plan", "model"),
        (body(prompt="Once upon"), "invalid_request", "exactly one of messages and prompt"),
        ({k: v for k, v in body().items() if k != "messages"}, "invalid_request", "exactly one"),
        (without_messages(prompt=["a", "b"]), "invalid_request", "prompt must be a string"),
        (body(logprobs="yes"), "invalid_request", "logprobs"),
        (body(echo=1), "invalid_request", "echo"),
        (body(logprobs=True, top_logprobs=TOP_LOGPROBS_MAX + 1), "invalid_request", "0..20"),
        (body(top_logprobs=2), "invalid_request", "top_logprobs needs logprobs"),
        (body(max_tokens=-1, echo=True), "invalid_request", "max_tokens"),
        (body(presence_penalty=2.5), "bad_sampling", "presence_penalty"),
        (body(frequency_penalty="high"), "bad_sampling", "frequency_penalty"),
        (body(logit_bias=[1, 2]), "bad_sampling", "logit_bias"),
        (body(logit_bias={"-1": 5}), "bad_sampling", "not a token id"),
        (body(logit_bias={"01": 5}), "bad_sampling", "not a token id"),
        (body(logit_bias={"hello": 5}), "bad_sampling", "not a token id"),
        # A second spelling of id 5 would bias it twice (+200, past the limit).
        (body(logit_bias={"5": 100, "5\n": 100}), "bad_sampling", "not a token id"),
        (body(logit_bias={"5": 100.5}), "bad_sampling", "-100..100"),
        (body(logit_bias={"5": True}), "bad_sampling", "number"),
        (
            body(logit_bias={str(i): 1 for i in range(LOGIT_BIAS_MAX_ENTRIES + 1)}),
            "bad_sampling",
            f"at most {LOGIT_BIAS_MAX_ENTRIES}",
        ),
    ],
)
def test_a_bad_request_is_refused_naming_the_field(raw: Any, code: str, words: str) -> None:
    error = refusal(raw)
    assert error.code == code
    assert words in error.message


@pytest.mark.parametrize(
    ("hop", "change", "words"),
    [
        (0, {"start_layer": 1}, "hop 0 must start at layer 0"),
        (1, {"start_layer": 3}, "must start at layer 2"),
        (1, {"end_layer": 1}, "contiguously"),
        (1, {"end_layer": "3"}, "integers"),
        (1, {"node_id": None}, "node_id"),
    ],
)
def test_a_plan_with_gaps_or_bad_hops_is_refused(
    hop: int, change: dict[str, Any], words: str
) -> None:
    raw = body()
    raw["plan"]["hops"][hop].update(change)
    error = refusal(raw)
    assert error.code == "invalid_plan"
    assert words in error.message


def test_a_hop_missing_a_field_is_named() -> None:
    raw = body()
    del raw["plan"]["hops"][1]["endpoint"]
    assert "lacks 'endpoint'" in refusal(raw).message


def test_the_tracker_and_the_node_apply_the_same_stop_rule() -> None:
    assert stop_sequences(None) == []
    assert stop_sequences("x") == ["x"]
    assert stop_sequences(["a"] * MAX_STOPS) == ["a"] * MAX_STOPS
    with pytest.raises(ProtocolError):
        stop_sequences(["a"] * (MAX_STOPS + 1))


def test_sampling_params_round_trip_through_their_json() -> None:
    params = SamplingParams(temperature=1.2, top_p=0.5, top_k=3, seed=None)
    assert SamplingParams.from_mapping(params.to_json()) == params
    assert SamplingParams(temperature=0.0).greedy and SamplingParams(1.0, top_k=1).greedy


def test_sampling_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ProtocolError) as caught:
        SamplingParams.from_mapping("{temperature")
    assert caught.value.code == "bad_sampling"


HEL = TokenLogprob(
    "Hel",
    -0.5,
    (72, 101, 108),
    (TopLogprob("Hel", -0.5, (72, 101, 108)), TopLogprob("He", -1.5, (72, 101))),
)
# A byte-level piece that holds half of "é": its bytes, its text with U+FFFD.
HALF = TokenLogprob(
    "\ufffd", -0.25, (195,), (TopLogprob("\ufffd", -0.25, (195,)), TopLogprob("e", -2.0, (101,)))
)
FRAMES = [
    ChunkFrame(role="assistant"),
    ChunkFrame(content="Hel", token_ids=(11, 12)),
    ChunkFrame(content="lo", token_ids=(13,), finish_reason="stop", usage=Usage(5, 3)),
    ChunkFrame(token_ids=(14,), finish_reason="length", usage=Usage(5, 4)),
    ChunkFrame(content="Hel", token_ids=(11, 12), logprobs=(HEL, HALF)),
    ChunkFrame(
        role="assistant",
        prompt_token_ids=(1, 11),
        prompt_logprobs=(TokenLogprob("<|im_start|>", None, ()), HEL),
    ),
]


@pytest.mark.parametrize(
    "frame",
    FRAMES,
    ids=["role", "content", "last", "last-without-text", "logprobs", "echo"],
)
def test_a_chunk_frame_survives_sse_encoding_and_parsing(frame: ChunkFrame) -> None:
    event = frame.event(completion_id="c-1", created=1, model="m")
    [line, blank, end] = event.decode().split("\n")
    assert (blank, end) == ("", "")
    assert sse_data(line) == frame.to_json(completion_id="c-1", created=1, model="m")
    assert parse_frame(sse_data(line)) == frame


def test_logprobs_are_in_openais_shape_and_an_echo_beside() -> None:
    *_, scored, echo = (f.to_json(completion_id="c", created=9, model="m") for f in FRAMES)

    assert scored["choices"][0]["logprobs"]["content"][0] == {
        "token": "Hel",
        "logprob": -0.5,
        "bytes": [72, 101, 108],
        "top_logprobs": [
            {"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108]},
            {"token": "He", "logprob": -1.5, "bytes": [72, 101]},
        ],
    }
    assert echo["meshnet_prompt_token_ids"] == [1, 11]
    assert echo["meshnet_prompt_logprobs"][0] == {
        "token": "<|im_start|>",
        "logprob": None,
        "bytes": [],
        "top_logprobs": [],
    }
    assert "logprobs" not in echo["choices"][0]


def test_chunk_frames_are_openai_chunks_with_the_token_ids_beside() -> None:
    role, content, last, *_ = (f.to_json(completion_id="c", created=9, model="m") for f in FRAMES)
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    ]
    assert "meshnet_token_ids" not in role
    assert content["choices"][0]["delta"] == {"content": "Hel"}
    assert content["meshnet_token_ids"] == [11, 12]
    assert last["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_an_error_frame_names_the_hop_and_says_whether_it_was_only_busy() -> None:
    failed = ErrorFrame("hop tail failed: timeout", node_id="tail")
    busy = ErrorFrame("hop tail failed: HTTP 503", code=HOP_BUSY, node_id="tail")
    assert failed.to_json()["error"] == {
        "message": "hop tail failed: timeout",
        "type": "upstream_error",
        "code": "hop_failed",
        "node_id": "tail",
    }
    assert parse_frame(json.loads(json.dumps(failed.to_json()))) == failed
    parsed = parse_frame(busy.to_json())
    assert isinstance(parsed, ErrorFrame)
    assert parsed.busy and not failed.busy


ENTRY = {"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": []}
FIRST: dict[str, Any] = {"token": "<s>", "logprob": None, "bytes": [], "top_logprobs": []}


def scored(**choice: Any) -> dict[str, Any]:
    """A chunk of one token id whose choice holds ``choice``."""
    return {"choices": [{"delta": {}, **choice}], "meshnet_token_ids": [7]}


@pytest.mark.parametrize(
    "payload",
    [
        [],
        {"choices": []},
        {"choices": [{"delta": "text"}]},
        {"choices": [{"delta": {"content": 5}}]},
        {"choices": [{"delta": {}, "finish_reason": 1}]},
        {"choices": [{"delta": {}}], "meshnet_token_ids": ["7"]},
        {"choices": [{"delta": {}}], "meshnet_token_ids": [True]},
        {"choices": [{"delta": {}}], "usage": {"prompt_tokens": 1}},
        {"error": "broken"},
        # logprobs: one entry per token id, finite and at most 0, bytes in 0..255.
        scored(logprobs={"content": []}),
        scored(logprobs=[ENTRY]),
        scored(logprobs={"content": [{**ENTRY, "logprob": 0.5}]}),
        scored(logprobs={"content": [{**ENTRY, "logprob": None}]}),
        scored(logprobs={"content": [{**ENTRY, "bytes": [256]}]}),
        scored(logprobs={"content": [{**ENTRY, "token": 7}]}),
        scored(logprobs={"content": [{**ENTRY, "top_logprobs": [ENTRY] * 21}]}),
        # an echo: ids and entries together, one each, the first without a logprob.
        {"choices": [{"delta": {}}], "meshnet_prompt_token_ids": [1, 2]},
        {
            "choices": [{"delta": {}}],
            "meshnet_prompt_token_ids": [1, 2],
            "meshnet_prompt_logprobs": [ENTRY, ENTRY],
        },
        {
            "choices": [{"delta": {}}],
            "meshnet_prompt_token_ids": [1, 2, 3],
            "meshnet_prompt_logprobs": [FIRST, ENTRY],
        },
    ],
)
def test_a_malformed_frame_is_refused(payload: Any) -> None:
    with pytest.raises(ProtocolError):
        parse_frame(payload)


def test_sse_lines_give_their_data_and_skip_everything_else() -> None:
    lines = [": keep-alive", "", "event: x", 'data: {"a":1}', "data:[DONE]"]
    assert [sse_data(line) for line in lines] == [None, None, None, {"a": 1}, SSE_DONE]
    assert sse_frames(lines) == [{"a": 1}, SSE_DONE]
    assert sse_event(SSE_DONE) == b"data: [DONE]\n\n"
    with pytest.raises(ProtocolError):
        sse_data("data: {oops")


def test_a_code_or_capability_with_a_trailing_newline_is_not_taken_for_one() -> None:
    assert relayable_code("hop_failed") == "hop_failed"
    assert relayable_code("hop_failed\n") is None
    assert capability_valid("a" * 64)
    assert not capability_valid("a" * 64 + "\n")


def test_an_echos_last_hop_gets_longer_for_scoring_every_prompt_position() -> None:
    assert step_time_limit(30.0, 1, echo=True) == 30.0 * ECHO_STEP_TIME_FACTOR
    blocks = step_time_limit(30.0, 2 * STEP_TIMEOUT_POSITIONS, echo=True)
    assert blocks == 60.0 * ECHO_STEP_TIME_FACTOR
