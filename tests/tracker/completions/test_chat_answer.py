"""The chat endpoint's answer: its chunks, byte for byte what the client is sent."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from nodes_app.protocol.sse import sse_event
from tracker_app.completions.chat_answer import ChatAnswer, choice_chunk
from tracker_app.completions.chat_request import chat_params_parse
from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.prompt_tokens import PromptCount
from tracker_app.completions.shapes import usage_of


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


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TWO_CALLS_AND_A_CUT = (
    '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}},'
    '{"name":"get_weather","arguments":{"city":"Rome"}},{"name":"get_weather","argu'
)


def cut_answer(tool_choice: str) -> tuple[Any, Any]:
    """A choice that made two calls and was cut in a third, streamed and whole."""
    params = parse(tools=[WEATHER_TOOL], tool_choice=tool_choice, max_tokens=60)
    streamed = ChatAnswer(completion_id="chatcmpl-1", created=1, params=params)
    events = [streamed.piece(Piece(0, text=text)) for text in ("{", TWO_CALLS_AND_A_CUT[1:])]
    events.append(streamed.finish(0, "length", None))
    generation = Generation(
        choice=0, prompt="", prompt_count=PromptCount(1, True), sampling=params.sampling()
    )
    generation.texts = [TWO_CALLS_AND_A_CUT]
    generation.finish_reason = "length"
    whole = ChatAnswer(completion_id="chatcmpl-2", created=1, params=params).reply(
        [generation], usage_of(1, 60), {"route": "r", "mode": "pinned", "hops": []}
    )
    frames = [frame + b"\n\n" for frame in b"".join(events).split(b"\n\n") if frame]
    return [chunk_of(frame) for frame in frames], whole["choices"][0]


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_calls_cut_by_max_tokens_come_back_as_the_calls_completed_told_as_length(
    tool_choice: str,
) -> None:
    chunks, whole = cut_answer(tool_choice)

    cities = ['{"city":"Oslo"}', '{"city":"Rome"}']
    assert whole["finish_reason"] == "length" and whole["message"]["content"] is None
    assert [call["function"]["arguments"] for call in whole["message"]["tool_calls"]] == cities
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert not any(delta.get("content") for delta in deltas)
    streamed = [
        call["function"]["arguments"] for delta in deltas for call in delta.get("tool_calls", [])
    ]
    assert [part for part in streamed if part] == cities
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_call_cut_before_it_was_complete_gives_no_calls_and_no_text() -> None:
    params = parse(tools=[WEATHER_TOOL], tool_choice="required", max_tokens=5)
    answer = ChatAnswer(completion_id="chatcmpl-1", created=1, params=params)

    assert answer.piece(Piece(0, text='{"tool_')) == b""
    [chunk] = [chunk_of(answer.finish(0, "length", None))]
    assert chunk["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length"}
