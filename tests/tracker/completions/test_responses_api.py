"""``POST /v1/responses`` through the official OpenAI client, on a real tracker and a
split tiny-model route (head 0-1, tail 2-3).

The tiny model's weights are random: its text is noise, so what is asserted is
the shape the client reads, and for JSON and calls the grammar's doing
(ADR-0022). Greedy decoding wherever an answer is compared or counted.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pytest
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage
from pydantic import BaseModel, Field

from tests.support.network import Network, billed_request
from tests.support.nodes import TINY

ASK = "What is the weather in Oslo?"
WEATHER_ARGUMENTS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": WEATHER_ARGUMENTS,
        "strict": True,
    }
]


class Person(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=120)
    role: Literal["admin", "user"]


@pytest.fixture(scope="module")
def network(tiny_split: Network) -> Network:
    return tiny_split


@pytest.fixture(scope="module")
def client(network: Network) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{network.url}/v1", api_key=network.api_key, max_retries=0)


def test_a_response_is_a_message_with_usage_and_its_status(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=TINY,
        instructions="Answer briefly.",
        input=ASK,
        max_output_tokens=12,
        temperature=0,
        store=False,
    )

    assert response.object == "response" and response.id.startswith("resp_")
    assert response.usage is not None and 0 < response.usage.output_tokens <= 12
    cut = response.usage.output_tokens == 12
    assert response.status == ("incomplete" if cut else "completed")
    if cut:
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    assert all(isinstance(item, ResponseOutputMessage) for item in response.output)
    assert response.output_text and (response.model_extra or {})["store"] is False
    route = (response.model_extra or {})["meshnet"]
    assert [hop["start_layer"] for hop in route["hops"]] == [0, 2]


def test_a_streamed_response_is_the_whole_response_event_by_event(
    client: openai.OpenAI,
) -> None:
    asked: dict[str, Any] = {"model": TINY, "input": ASK, "max_output_tokens": 16}
    asked["temperature"] = 0
    whole = client.responses.create(**asked)

    # The client's stream helper gives a final response only when it completed; this
    # one may be cut, which ends the stream with response.incomplete instead.
    events = list(client.responses.create(stream=True, **asked))

    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{whole.status}"
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    streamed = last.response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == streamed.output_text == whole.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert streamed.usage == whole.usage and streamed.status == whole.status


def test_a_json_schema_format_is_followed_and_parsed(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(
        model=TINY, input="Describe a person.", text_format=Person, max_output_tokens=200
    )
    assert isinstance(parsed.output_parsed, Person)

    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model=TINY,
        input="A flag.",
        text={"format": {"type": "json_schema", "name": "flag", "schema": schema, "strict": True}},
        temperature=0,
        max_output_tokens=60,
    )
    jsonschema.validate(json.loads(response.output_text), schema)
    any_object = client.responses.create(
        model=TINY, input="JSON.", text={"format": {"type": "json_object"}}, max_output_tokens=200
    )
    if any_object.status == "completed":
        assert isinstance(json.loads(any_object.output_text), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_function_call_is_a_function_call_item(
    client: openai.OpenAI, stream: bool
) -> None:
    asked: dict[str, Any] = {"model": TINY, "input": ASK, "tools": TOOLS}
    asked |= {"tool_choice": "required", "parallel_tool_calls": False, "temperature": 0}
    asked["max_output_tokens"] = 200
    if stream:
        with client.responses.stream(**asked) as events:
            arguments = "".join(
                e.delta for e in events if e.type == "response.function_call_arguments.delta"
            )
            response = events.get_final_response()
    else:
        response = client.responses.create(**asked)

    assert response.status == "completed"
    [call] = response.output
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "weather"
    assert call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_ARGUMENTS)
    if stream:
        assert arguments == call.arguments


def test_auto_answers_with_a_message_or_valid_function_calls(client: openai.OpenAI) -> None:
    for text in ("Oslo?", "Rome?"):
        response = client.responses.create(
            model=TINY, input=text, tools=TOOLS, temperature=0, max_output_tokens=40
        )

        kinds = {item.type for item in response.output}
        assert kinds <= {"message"} or kinds == {"function_call"}
        for item in response.output:
            if isinstance(item, ResponseFunctionToolCall):
                jsonschema.validate(json.loads(item.arguments), WEATHER_ARGUMENTS)


def test_a_function_call_output_is_taken_in_the_next_request(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=TINY,
        input=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "weather"},
        temperature=0,
        max_output_tokens=200,
    )
    [call] = first.output
    assert isinstance(call, ResponseFunctionToolCall)
    history: list[Any] = [
        {"role": "user", "content": ASK},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "12 C, rain"},
    ]

    after: dict[str, Any] = {"model": TINY, "temperature": 0, "max_output_tokens": 4}
    answer = client.responses.create(input=history, tools=TOOLS, tool_choice="none", **after)
    alone = client.responses.create(input=ASK, **after)

    assert answer.usage is not None and alone.usage is not None
    written = len(call.arguments) + len("12 C, rain")
    assert answer.usage.input_tokens > alone.usage.input_tokens + written


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"not": {}}}}}, "text"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"model": TINY, "input": ASK, "max_output_tokens": 4}

    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**(body | fields))

    assert refused.value.param == param


def test_a_bad_key_is_a_401(network: Network) -> None:
    stranger = openai.OpenAI(base_url=f"{network.url}/v1", api_key="sk-nobody", max_retries=0)

    with pytest.raises(openai.AuthenticationError):
        stranger.responses.create(model=TINY, input=ASK, max_output_tokens=2)


def test_its_requests_are_recorded_and_billed_as_coming_through_this_api(
    client: openai.OpenAI, network: Network
) -> None:
    whole = client.responses.create(model=TINY, input=ASK, max_output_tokens=4, temperature=0)
    events = client.responses.create(
        model=TINY, input=ASK, max_output_tokens=4, temperature=0, stream=True
    )
    [streamed] = [event.response for event in events if event.type == "response.created"]

    for response in (whole, streamed):
        assert billed_request(network, response.id) == ("responses", "completed")
