"""The Messages answer: Anthropic's events, which add up to the whole message."""

from __future__ import annotations

import json
from typing import Any

from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, ParsedMessage, RawMessageStreamEvent
from pydantic import TypeAdapter

from routing_app.policies.choice import NoRouteAvailable
from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.messages_answer import MessagesAnswer
from tracker_app.completions.messages_request import messages_params_parse
from tracker_app.completions.prompt_tokens import PromptCount
from tracker_app.completions.shapes import usage_of

ROUTE: Any = {"route": "r", "mode": "pinned", "hops": []}
PING = {"name": "ping", "input_schema": {"type": "object", "properties": {}}}
EVENT = TypeAdapter[RawMessageStreamEvent](RawMessageStreamEvent)


def answered(texts: list[str], finish: str, **body: Any) -> tuple[Message, dict[str, Any]]:
    """The message the client's stream accumulates from the events, and the whole reply."""
    fields = {"model": "m", "max_tokens": 60, "messages": [{"role": "user", "content": "hi"}]}
    params = messages_params_parse(json.dumps(fields | body).encode())
    streamed = MessagesAnswer(completion_id="msg_1", created=1, params=params)
    events = streamed.opening(ROUTE)
    events += [streamed.piece(Piece(0, text=text)) for text in texts]
    events.append(streamed.finish(0, finish, usage_of(3, 7)))
    snapshot: ParsedMessage[None] | None = None
    buffers: dict[int, bytes] = {}
    for frame in b"".join(events).split(b"\n\n"):
        if frame:
            name, data = frame.split(b"\n")
            assert name.startswith(b"event: ")
            event = EVENT.validate_json(data.removeprefix(b"data: "))
            assert event.type == name.removeprefix(b"event: ").decode()
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    assert snapshot is not None
    generation = Generation(
        choice=0, prompt="", prompt_count=PromptCount(3, True), sampling=params.sampling()
    )
    generation.texts, generation.finish_reason = texts, finish
    whole = MessagesAnswer(completion_id="msg_1", created=1, params=params).reply(
        [generation], usage_of(3, 7), ROUTE
    )
    return snapshot, dict(whole)


def same(streamed: Message, whole: dict[str, Any]) -> None:
    """The streamed message is the whole one (tool ids aside: each answer draws its own)."""
    got = streamed.model_dump(exclude_none=True)
    expected = Message.model_validate(whole).model_dump(exclude_none=True)
    for message in (got, expected):
        for block in message["content"]:
            block.pop("id", None)
    assert got == expected


def test_streamed_text_adds_up_to_the_whole_message() -> None:
    streamed, whole = answered(["Hel", "lo ", "there"], "length")

    same(streamed, whole)
    assert whole["content"] == [{"type": "text", "text": "Hello there"}]
    assert whole["stop_reason"] == "max_tokens"
    assert whole["usage"] == {"input_tokens": 3, "output_tokens": 7, "cache_read_input_tokens": 0}


def test_calls_cut_by_max_tokens_come_back_as_the_tool_use_blocks_completed() -> None:
    call = '{"name":"ping","arguments":{}}'
    cut = ['{"tool_calls":[', call, ",", call, ',{"name":"pi']

    streamed, whole = answered(cut, "length", tools=[PING], tool_choice={"type": "any"})

    same(streamed, whole)
    assert [(b["type"], b["name"], b["input"]) for b in whole["content"]] == [
        ("tool_use", "ping", {}),
        ("tool_use", "ping", {}),
    ]
    assert whole["stop_reason"] == "max_tokens"


def test_whole_calls_end_with_tool_use() -> None:
    texts = ['{"tool_calls":[{"name":"ping","arguments":{}}]}']

    streamed, whole = answered(texts, "stop", tools=[PING], tool_choice={"type": "any"})

    same(streamed, whole)
    assert whole["stop_reason"] == "tool_use" and whole["content"][0]["id"].startswith("toolu_")


def test_a_streams_message_delta_reports_the_whole_replys_meshnet_with_its_drafts() -> None:
    fields = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    answer = MessagesAnswer(
        completion_id="msg_1", created=1, params=messages_params_parse(json.dumps(fields).encode())
    )
    final: Any = {**ROUTE, "speculation": {"drafted": 5, "accepted": 3}}
    answer.opening(ROUTE)

    frames = answer.finish(0, "stop", usage_of(3, 7), None, final).strip().split(b"\n\n")

    events = {
        name.removeprefix(b"event: ").decode(): data.removeprefix(b"data: ")
        for name, data in (frame.split(b"\n") for frame in frames)
    }
    assert json.loads(events["message_delta"])["meshnet"] == final
    assert EVENT.validate_json(events["message_delta"]).type == "message_delta"


def test_a_stream_the_network_failed_ends_with_anthropics_error_event() -> None:
    params = messages_params_parse(
        json.dumps(
            {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        ).encode()
    )
    answer = MessagesAnswer(completion_id="msg_1", created=1, params=params)

    event = answer.failed(NoRouteAvailable("m", "every hop is down"))

    name, data = event.strip().split(b"\n")
    assert name == b"event: error"
    assert json.loads(data.removeprefix(b"data: ")) == {
        "type": "error",
        "error": {
            "type": "overloaded_error",
            "message": "No route can serve m right now: every hop is down",
        },
    }
