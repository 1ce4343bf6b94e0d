"""The head's frames: OpenAI chunks that survive SSE and parsing; malformed ones refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodes_app.protocol.errors import HOP_BUSY, ProtocolError
from nodes_app.protocol.frames import ChunkFrame, ErrorFrame, parse_frame
from nodes_app.protocol.logprobs import TokenLogprob, TopLogprob
from nodes_app.protocol.sse import sse_data
from nodes_app.protocol.usage import Usage

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
