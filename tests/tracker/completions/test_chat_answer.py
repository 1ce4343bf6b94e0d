"""The chat endpoint's answer: its chunks, byte for byte what the client is sent."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from nodes_app.protocol.sse import sse_event
from tracker_app.completions.chat_answer import ChatAnswer, choice_chunk
from tracker_app.completions.chat_request import chat_params_parse
from tracker_app.completions.generation import Piece


def parse(**body: Any) -> Any:
    base: dict[str, Any] = {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": "hi"}],
    }
    return chat_params_parse(json.dumps({**base, **body}).encode())


@pytest.mark.parametrize("text", ["hello", "", 'quote " and \\ back', "naïve ✓ 日本", "\x00\n\t"])
@pytest.mark.parametrize("choice", [0, 3])
def test_a_text_chunks_event_is_byte_for_byte_the_chunk_the_client_would_get_encoded_whole(
    text: str, choice: int
) -> None:
    fields: dict[str, Any] = {
        "completion_id": "chatcmpl-ab12",
        "created": 1767225600,
        "model": 'm"odel\x00',
    }
    params = replace(parse(n=4), model=fields["model"])
    answer = ChatAnswer(
        completion_id=fields["completion_id"], created=fields["created"], params=params
    )

    event = answer.piece(Piece(choice, text=text))

    assert event == sse_event(choice_chunk(**fields, choice=choice, delta={"content": text}))
    assert chunk_of(event)["choices"][0]["index"] == choice


def chunk_of(event: bytes) -> Any:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[6:])
