"""How a Messages body becomes what the chat pipeline runs: the conversation the model
is shown, the tools' grammar, and what is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tracker_app.completions.messages_request import messages_params_parse
from tracker_app.completions.parameters import InvalidRequest, UnsupportedParameter

PING = {"name": "ping", "input_schema": {"type": "object", "properties": {}}}


def parse(**body: Any) -> Any:
    fields: dict[str, Any] = {"model": "m", "max_tokens": 8}
    fields["messages"] = [{"role": "user", "content": "hi"}]
    return messages_params_parse(json.dumps(fields | body).encode())


def test_system_calls_and_results_become_the_chats_turns() -> None:
    params = parse(
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": "Ping?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Pinging."},
                    {"type": "tool_use", "id": "toolu_1", "name": "ping", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "pong"},
                    {"type": "text", "text": "Again?"},
                ],
            },
        ],
        tools=[PING],
        stop_sequences=["END"],
        temperature=0.5,
        top_k=5,
    )

    assert [(m["role"], m.get("content")) for m in params.messages] == [
        ("system", "Be brief."),
        ("user", "Ping?"),
        ("assistant", "Pinging."),
        ("tool", "pong"),
        ("user", "Again?"),
    ]
    assert params.messages[2]["tool_calls"][0]["function"] == {"name": "ping", "arguments": "{}"}
    [prompt] = params.prompts
    assert prompt[0]["role"] == "system" and "ping" in prompt[0]["content"]
    assert "Result of ping (call toolu_1): pong" in prompt[-2]["content"]
    assert (params.stop, params.temperature, params.top_k, params.max_tokens) == (
        ["END"],
        0.5,
        5,
        8,
    )
    assert params.tool_use is not None and params.tool_use.mode == "auto"


@pytest.mark.parametrize(
    ("choice", "mode", "named", "parallel"),
    [
        ({"type": "any"}, "required", None, True),
        ({"type": "tool", "name": "ping"}, "named", "ping", True),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", None, False),
    ],
)
def test_tool_choice_is_the_chats(
    choice: dict[str, Any], mode: str, named: str | None, parallel: bool
) -> None:
    use = parse(tools=[PING], tool_choice=choice).tool_use

    assert (use.mode, use.named, use.parallel) == (mode, named, parallel)


def test_tool_choice_none_offers_no_tools() -> None:
    params = parse(tools=[PING], tool_choice={"type": "none"})

    assert params.tool_use is None and params.grammar is None


def test_an_output_schema_is_a_grammar_and_not_with_tools() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    output = {"format": {"type": "json_schema", "schema": schema}}

    assert parse(output_config=output).grammar is not None
    with pytest.raises(InvalidRequest, match="output_config"):
        parse(output_config=output, tools=[PING], tool_choice={"type": "any"})


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking"),
        ({"n": 2}, "'n'"),
        ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, "document"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "bash_20250124"),
        ({"output_config": {"effort": "high"}}, "effort"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(body: dict[str, Any], named: str) -> None:
    with pytest.raises(UnsupportedParameter, match=named):
        parse(**body)


def test_what_asks_for_nothing_is_accepted() -> None:
    params = parse(
        thinking={"type": "disabled"},
        service_tier="auto",
        metadata={"user_id": "u1"},
        cache_control={"type": "ephemeral"},
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi", "cache_control": None, "citations": None}
                ],
            }
        ],
    )

    assert params.messages == ({"role": "user", "content": "hi"},)
