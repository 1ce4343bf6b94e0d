"""The Responses answer: typed events the official client reads, ending in the whole
response."""

from __future__ import annotations

import json
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.prompt_tokens import PromptCount
from tracker_app.completions.responses_answer import ResponsesAnswer
from tracker_app.completions.responses_request import responses_params_parse
from tracker_app.completions.shapes import usage_of

ROUTE: Any = {"route": "r", "mode": "pinned", "hops": []}
# What the proxy gives the request's last event and its whole reply.
FINAL: Any = {**ROUTE, "speculation": {"drafted": 5, "accepted": 3}}
PING = {"type": "function", "name": "ping", "parameters": {"type": "object", "properties": {}}}
EVENT = TypeAdapter[ResponseStreamEvent](ResponseStreamEvent)


def answered(texts: list[str], finish: str, **body: Any) -> tuple[list[Any], dict[str, Any]]:
    """The events a stream sends (as the client reads them), and the whole reply."""
    params = responses_params_parse(json.dumps({"model": "m", "input": "hi"} | body).encode())
    streamed = ResponsesAnswer(completion_id="resp_1", created=1, params=params)
    events = streamed.opening(ROUTE)
    events += [streamed.piece(Piece(0, text=text)) for text in texts]
    events.append(streamed.finish(0, finish, usage_of(3, 7), None, FINAL))
    read = []
    for frame in b"".join(events).split(b"\n\n"):
        if frame:
            name, data = frame.split(b"\n")
            event = EVENT.validate_json(data.removeprefix(b"data: "))
            assert event.type == name.removeprefix(b"event: ").decode()
            read.append(event)
    generation = Generation(
        choice=0, prompt="", prompt_count=PromptCount(3, True), sampling=params.sampling()
    )
    generation.texts, generation.finish_reason = texts, finish
    whole = ResponsesAnswer(completion_id="resp_1", created=1, params=params).reply(
        [generation], usage_of(3, 7), FINAL
    )
    return read, dict(whole)


def without_ids(response: Response) -> dict[str, Any]:
    """A response as JSON, its items' ids (each answer draws its own) left out."""
    dumped = response.model_dump(exclude_none=True)
    for item in dumped["output"]:
        item.pop("id", None)
        item.pop("call_id", None)
    return dumped


def test_streamed_text_ends_in_the_whole_response() -> None:
    events, whole = answered(["Hel", "lo"], "stop", max_output_tokens=9)

    final = events[-1]
    assert final.type == "response.completed"
    assert without_ids(final.response) == without_ids(Response.model_validate(whole))
    assert final.response.output_text == "Hello" and final.response.max_output_tokens == 9
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_stream_opens_with_the_route_and_completes_with_the_replys_drafts() -> None:
    events, whole = answered(["Hi"], "stop")

    assert (events[0].response.model_extra or {})["meshnet"] == ROUTE
    assert (events[-1].response.model_extra or {})["meshnet"] == whole["meshnet"] == FINAL


def test_calls_cut_by_max_output_tokens_are_the_function_calls_completed() -> None:
    call = '{"name":"ping","arguments":{}}'
    cut = ['{"tool_calls":[', call, ",", call, ',{"name":"pi']

    events, whole = answered(cut, "length", tools=[PING], tool_choice="required")

    final = events[-1]
    assert final.type == "response.incomplete"
    assert without_ids(final.response) == without_ids(Response.model_validate(whole))
    assert whole["status"] == "incomplete"
    assert whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [(item["type"], item["name"], item["arguments"]) for item in whole["output"]] == [
        ("function_call", "ping", "{}"),
        ("function_call", "ping", "{}"),
    ]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert deltas == ["{}", "{}"] and not any(
        e.type.startswith("response.output_text") for e in events
    )
