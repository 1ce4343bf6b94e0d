"""How a Responses body becomes what the chat pipeline runs: the conversation the model
is shown, the format's and tools' grammar, and what is refused (nothing is stored)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tracker_app.completions.parameters import InvalidRequest, UnsupportedParameter
from tracker_app.completions.responses_request import responses_params_parse

PING = {"type": "function", "name": "ping", "parameters": {"type": "object", "properties": {}}}


def parse(**body: Any) -> Any:
    return responses_params_parse(json.dumps({"model": "m", "input": "hi"} | body).encode())


def test_instructions_items_calls_and_their_outputs_become_the_chats_turns() -> None:
    params = parse(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Ping twice?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "ping", "arguments": "{}"},
            {"type": "function_call", "call_id": "call_2", "name": "ping", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "pong 1"},
            {"type": "function_call_output", "call_id": "call_2", "output": "pong 2"},
        ],
        tools=[PING],
        tool_choice={"type": "function", "name": "ping"},
        parallel_tool_calls=False,
        max_output_tokens=9,
    )

    assert [m["role"] for m in params.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in params.messages[2]["tool_calls"]] == ["call_1", "call_2"]
    assert params.tool_use is not None
    assert (params.tool_use.named, params.tool_use.parallel) == ("ping", False)
    assert params.max_tokens == 9 and params.echoed["instructions"] == "Be brief."


def test_a_text_is_one_user_message_and_text_format_is_a_grammar() -> None:
    plain = parse()
    formatted = parse(text={"format": {"type": "json_object"}})

    assert plain.messages == ({"role": "user", "content": "hi"},) and plain.grammar is None
    assert formatted.grammar is not None and formatted.format_param == "text"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "file_search"}]}, "tools"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
        ({"frequency_penalty": 1}, "frequency_penalty"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(UnsupportedParameter) as refused:
        parse(**body)

    assert refused.value.param == param


def test_store_false_and_neutral_values_are_accepted() -> None:
    parse(store=False, truncation="disabled", include=[], reasoning=None, metadata={"a": "b"})


def test_a_format_with_callable_tools_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="text"):
        parse(text={"format": {"type": "json_object"}}, tools=[PING], tool_choice="required")
