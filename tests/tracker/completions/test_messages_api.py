"""``POST /v1/messages`` through the official Anthropic client, on a real tracker and a
split tiny-model route (head 0-1, tail 2-3).

The tiny model's weights are random: its text is noise, so what is asserted is
the shape the client reads, and for tools the grammar's doing (ADR-0022). Greedy
decoding wherever an answer is compared or counted.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import jsonschema
import pytest
from anthropic.types import TextBlock, ToolUseBlock

from tests.support.network import Network, billed_request
from tests.support.nodes import TINY

# The client takes sampling fields as extra body fields (its types no longer list them).
GREEDY = {"temperature": 0}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Oslo?"}]
WEATHER_INPUT = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"name": "weather", "description": "The weather in a city.", "input_schema": WEATHER_INPUT},
    {"name": "time", "input_schema": {"type": "object", "properties": {}}},
]


@pytest.fixture(scope="module")
def network(tiny_split: Network) -> Network:
    return tiny_split


@pytest.fixture(scope="module")
def client(network: Network) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=network.url, api_key=network.api_key, max_retries=0)


def test_a_message_is_text_blocks_with_usage_and_why_it_stopped(
    client: anthropic.Anthropic, network: Network
) -> None:
    message = client.messages.create(
        model=TINY,
        system="Answer briefly.",
        messages=ASK,
        max_tokens=12,
        extra_body=GREEDY,
    )

    assert (
        message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    )
    assert all(isinstance(block, TextBlock) for block in message.content)
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 12
    assert message.stop_reason == (
        "max_tokens" if message.usage.output_tokens == 12 else "end_turn"
    )
    route = (message.model_extra or {})["meshnet"]
    assert [hop["start_layer"] for hop in route["hops"]] == [0, 2]


def test_a_streamed_message_is_the_whole_message_event_by_event(
    client: anthropic.Anthropic,
) -> None:
    asked: dict[str, Any] = {"model": TINY, "messages": ASK, "max_tokens": 16, "extra_body": GREEDY}
    whole = client.messages.create(**asked)

    with client.messages.stream(**asked) as stream:
        events = list(stream)
        streamed = stream.get_final_message()

    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    start = events[0]
    assert start.type == "message_start"
    assert start.message.usage.input_tokens == whole.usage.input_tokens
    assert "message_delta" in kinds
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (
        whole.stop_reason,
        whole.usage.output_tokens,
    )
    assert streamed.usage.input_tokens == whole.usage.input_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_use_carries_input_valid_for_its_schema(
    client: anthropic.Anthropic, stream: bool
) -> None:
    asked: dict[str, Any] = {
        "model": TINY,
        "messages": ASK,
        "max_tokens": 200,
        "extra_body": GREEDY,
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "weather"},
    }
    if stream:
        with client.messages.stream(**asked) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**asked)

    assert message.stop_reason == "tool_use"
    [block] = message.content
    assert isinstance(block, ToolUseBlock) and block.name == "weather"
    assert block.id.startswith("toolu_")
    jsonschema.validate(block.input, WEATHER_INPUT)


def test_any_tool_or_auto_answers_with_valid_calls_or_text(client: anthropic.Anthropic) -> None:
    forced = client.messages.create(
        model=TINY,
        messages=ASK,
        max_tokens=200,
        extra_body=GREEDY,
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    assert forced.stop_reason == "tool_use" and len(forced.content) == 1
    assert isinstance(forced.content[0], ToolUseBlock)

    for seed_text in ("Oslo?", "Rome?"):
        auto = client.messages.create(
            model=TINY,
            messages=[{"role": "user", "content": seed_text}],
            max_tokens=40,
            extra_body=GREEDY,
            tools=TOOLS,
        )
        if auto.stop_reason == "tool_use":
            assert all(isinstance(block, ToolUseBlock) for block in auto.content)
        else:
            assert all(isinstance(block, TextBlock) for block in auto.content)


def test_a_tool_result_is_taken_in_the_next_request(client: anthropic.Anthropic) -> None:
    first = client.messages.create(
        model=TINY,
        messages=ASK,
        max_tokens=200,
        extra_body=GREEDY,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "weather"},
    )
    [call] = first.content
    assert isinstance(call, ToolUseBlock)
    history: list[Any] = [
        *ASK,
        {"role": "assistant", "content": [call.model_dump()]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "12 C, rain"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]

    answer = client.messages.create(model=TINY, messages=history, max_tokens=4, extra_body=GREEDY)
    alone = client.messages.create(model=TINY, messages=ASK, max_tokens=4, extra_body=GREEDY)

    # The call, its result and the next words are in the prompt: the tokenizer spells bytes.
    written = len(str(call.input)) + len("12 C, rain") + len("And tomorrow?")
    assert answer.usage.input_tokens > alone.usage.input_tokens + written


def test_a_stop_sequence_that_ends_the_answer_is_named(client: anthropic.Anthropic) -> None:
    # A forced call writes '{"tool_calls":[{"name":' first: the stop sequence ends it there.
    message = client.messages.create(
        model=TINY,
        messages=ASK,
        max_tokens=200,
        extra_body=GREEDY,
        tools=TOOLS,
        tool_choice={"type": "any"},
        stop_sequences=["zz", '"name"'],
    )

    assert (message.stop_reason, message.stop_sequence, message.content) == (
        "stop_sequence",
        '"name"',
        [],
    )


def test_the_key_is_taken_as_a_bearer_token_too(network: Network) -> None:
    bearer = anthropic.Anthropic(base_url=network.url, auth_token=network.api_key, max_retries=0)

    message = bearer.messages.create(model=TINY, messages=ASK, max_tokens=2, extra_body=GREEDY)

    assert message.usage.output_tokens <= 2


def test_a_bad_key_is_an_anthropic_authentication_error(network: Network) -> None:
    stranger = anthropic.Anthropic(base_url=network.url, api_key="sk-nobody", max_retries=0)

    with pytest.raises(anthropic.AuthenticationError) as refused:
        stranger.messages.create(model=TINY, messages=ASK, max_tokens=2)

    assert refused.value.status_code == 401
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"output_format": {"type": "json_schema", "schema": {}}}, "output_format"),
        ({"frequency_penalty": 1}, "frequency_penalty"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}
                        ],
                    }
                ]
            },
            "image",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search"),
        ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
        ({"temperature": 1.5}, "temperature"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_in_anthropics_shape_naming_it(
    client: anthropic.Anthropic, fields: dict[str, Any], named: str
) -> None:
    body: dict[str, Any] = {"model": TINY, "messages": ASK, "max_tokens": 4}
    known = {k: v for k, v in fields.items() if k in ("messages", "tools", "tool_choice")}
    extra = {k: v for k, v in fields.items() if k not in known}

    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(**(body | known), extra_body=extra)

    error = refused.value.body["error"]  # type: ignore[index]
    assert refused.value.body["type"] == "error"  # type: ignore[index]
    assert error["type"] == "invalid_request_error" and named in error["message"]


def test_an_output_config_schema_is_followed(client: anthropic.Anthropic) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }

    message = client.messages.create(
        model=TINY,
        messages=ASK,
        max_tokens=60,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body=GREEDY,
    )

    [block] = message.content
    assert isinstance(block, TextBlock) and message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(block.text), schema)


def test_its_requests_are_recorded_and_billed_as_coming_through_this_api(
    client: anthropic.Anthropic, network: Network
) -> None:
    whole = client.messages.create(model=TINY, messages=ASK, max_tokens=4, extra_body=GREEDY)
    with client.messages.stream(
        model=TINY, messages=ASK, max_tokens=4, extra_body=GREEDY
    ) as stream:
        streamed = stream.get_final_message()

    for message in (whole, streamed):
        assert billed_request(network, message.id) == ("messages", "completed")
