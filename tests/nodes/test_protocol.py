"""The tracker↔node protocol: what one side encodes the other parses back; bad input named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodes_app.protocol import (
    HOP_BUSY,
    MAX_STOP_LENGTH,
    MAX_STOPS,
    SSE_DONE,
    ChunkFrame,
    ErrorFrame,
    GenerateRequest,
    PlanHop,
    ProtocolError,
    SamplingParams,
    Usage,
    parse_frame,
    sse_data,
    sse_event,
    sse_frames,
    stop_sequences,
)

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


FRAMES = [
    ChunkFrame(role="assistant"),
    ChunkFrame(content="Hel", token_ids=(11, 12)),
    ChunkFrame(content="lo", token_ids=(13,), finish_reason="stop", usage=Usage(5, 3)),
    ChunkFrame(token_ids=(14,), finish_reason="length", usage=Usage(5, 4)),
]


@pytest.mark.parametrize("frame", FRAMES, ids=["role", "content", "last", "last-without-text"])
def test_a_chunk_frame_survives_sse_encoding_and_parsing(frame: ChunkFrame) -> None:
    event = sse_event(frame.to_json(completion_id="c-1", created=1, model="m"))
    [line, blank, end] = event.decode().split("\n")
    assert (blank, end) == ("", "")
    assert parse_frame(sse_data(line)) == frame


def test_chunk_frames_are_openai_chunks_with_the_token_ids_beside() -> None:
    role, content, last, _ = (f.to_json(completion_id="c", created=9, model="m") for f in FRAMES)
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
    assert parse_frame(busy.to_json()).busy and not failed.busy


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
