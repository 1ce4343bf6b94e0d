"""What every endpoint's answer is made of: a text chunk's event written from a template,
the error event that ends a failed stream, named events, and a choice's text held back
while it opens as tool calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshnet_site.errors import DomainError, ErrorKind
from nodes_app.protocol.sse import sse_event
from tracker_app.completions.answers import HeldCalls, TextEvents, openai_failed, sse_named
from tracker_app.completions.tools import ToolUse, tool_use_parse

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
CALL = '{"tool_calls": [{"name": "weather", "arguments": {"city": "Paris"}}]}'


class NoRoute(DomainError):
    kind = ErrorKind.UNAVAILABLE
    code = "no_route"


def chunk(text: str) -> dict[str, Any]:
    return {"id": "c-1", "choices": [{"index": 0, "delta": {"content": text}}], "model": "m"}


def tools(tool_choice: str) -> ToolUse:
    use = tool_use_parse([WEATHER], tool_choice, None)
    assert use is not None
    return use


@pytest.mark.parametrize("text", ["plain", 'a "quoted" word', "line\nbreak", "é 🚀", "", "\\"])
def test_a_text_chunks_event_is_byte_for_byte_the_chunks_own_event(text: str) -> None:
    events = TextEvents.around(chunk)

    assert events.event(text) == sse_event(chunk(text))


def test_a_failed_stream_ends_with_an_openai_error_event() -> None:
    event = openai_failed(NoRoute("No route can serve the model"))

    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    error = json.loads(event.removeprefix(b"data: "))["error"]
    assert (error["code"], error["message"]) == ("no_route", "No route can serve the model")


def test_a_named_event_carries_its_name_before_its_data() -> None:
    event = sse_named("message_stop", {"type": "message_stop"})

    assert event == b"event: message_stop\n" + sse_event({"type": "message_stop"})


def test_without_tools_no_text_is_held_back() -> None:
    held = HeldCalls(None, choices=2)

    assert not held.holds(0, "{")
    assert held.release(0) is None


def test_a_choice_that_must_call_holds_its_text_and_releases_its_calls() -> None:
    held = HeldCalls(tools("required"), choices=1)

    assert [held.holds(0, piece) for piece in (CALL[:10], CALL[10:])] == [True, True]
    calls = held.release(0)

    assert calls is not None and calls.whole
    [call] = calls.calls
    assert call["function"]["name"] == "weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_in_auto_mode_text_that_does_not_open_as_calls_is_sent_as_it_comes() -> None:
    held = HeldCalls(tools("auto"), choices=2)

    assert not held.holds(0, "It is sunny.")
    assert not held.holds(0, "{ not held: the choice is text")
    assert held.holds(1, CALL)
    assert held.release(0) is None
    assert held.release(1) is not None
