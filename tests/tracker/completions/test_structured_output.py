"""``response_format`` through the official OpenAI client, on a real tracker and a split
tiny-model route (head 0-1, tail 2-3): the tail follows the schema's grammar.

The tiny model's weights are random: every answer being valid JSON for its
schema is the constraint's doing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from pydantic import BaseModel, Field

from tests.support.network import Network, head_generate, redundant_tiny_network
from tests.support.nodes import TINY
from tests.support.sse import chunks_of, text_of
from tracker_app.completions.structured import response_format_grammar

PROMPT: list[Any] = [{"role": "user", "content": "Describe a person as JSON."}]


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


def test_the_clients_parse_returns_the_pydantic_model_for_every_seed(
    client: openai.OpenAI,
) -> None:
    for seed in range(3):
        reply = client.chat.completions.parse(
            model=TINY,
            messages=PROMPT,
            response_format=Person,
            temperature=1.0,
            seed=seed,
            max_tokens=200,
        )

        choice = reply.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Person)
        assert choice.message.content == choice.message.parsed.model_dump_json()


def test_streamed_json_mode_choices_are_each_a_json_object(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=TINY,
        messages=PROMPT,
        response_format={"type": "json_object"},
        temperature=1.0,
        seed=3,
        n=2,
        max_tokens=300,
        stream=True,
    )
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason

    assert set(texts) == {0, 1}
    for index, text in texts.items():
        if finishes[index] == "stop":
            assert isinstance(json.loads(text), dict)
        else:  # cut by max_tokens, as finish_reason says
            assert finishes[index] == "length" and text.startswith("{")


def test_a_schema_given_as_json_is_followed_on_the_split_route(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=TINY,
        messages=PROMPT,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "flag", "schema": schema, "strict": True},
        },
        temperature=1.0,
        seed=11,
        max_tokens=50,
    )

    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), schema)


LONG = {
    "type": "object",
    "properties": {
        "values": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "minItems": 120,
            "maxItems": 120,
        }
    },
    "required": ["values"],
    "additionalProperties": False,
}


@pytest.fixture
def redundant(tmp_path: Path) -> Iterator[Network]:
    """Two routes for the tiny model: head 0-1 -> tail 2-3, and one whole node 0-3."""
    yield from redundant_tiny_network(tmp_path)


def test_a_failover_mid_answer_resumes_the_schema_and_gives_the_uninterrupted_answer(
    redundant: Network,
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "long", "schema": LONG}}
    grammar = response_format_grammar(fmt)
    whole = redundant.nodes["whole"]
    asked: dict[str, Any] = {"model": TINY, "messages": PROMPT, "max_tokens": 400}
    expected = head_generate(
        redundant, whole, [whole.hop()], **asked, temperature=0.0, grammar=grammar
    )
    frames: list[Any] = []
    killed = None
    for frame in redundant.iter_stream(**asked, temperature=0, response_format=fmt):
        frames.append(frame)
        if killed is None and any(
            c["choices"][0]["delta"].get("content") for c in chunks_of(frames)
        ):
            last_hop = chunks_of(frames)[0]["meshnet"]["hops"][-1]["node_id"]
            killed = next(n for n in redundant.nodes.values() if n.node_id == last_hop)
            killed.kill()

    assert killed is not None
    assert not [f for f in frames if isinstance(f, dict) and "error" in f]
    assert text_of(frames) == expected
    jsonschema.validate(json.loads(expected), LONG)
    [(status, signature)] = redundant.query(
        "SELECT status, route_signature FROM tracker_app_chatrequest"
    )
    assert status == "completed" and killed.node_id not in signature  # it did fail over


def test_an_answer_cut_by_max_tokens_is_told_as_length(client: openai.OpenAI) -> None:
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(
            model=TINY, messages=PROMPT, response_format=Person, max_tokens=3
        )


@pytest.mark.parametrize(
    ("response_format", "named"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}, "not"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
            "strin",
        ),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}, "name"),
        ({"type": "yaml"}, "yaml"),
    ],
)
def test_a_format_that_cannot_be_followed_is_a_400_naming_the_construct(
    client: openai.OpenAI, response_format: Any, named: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=TINY, messages=PROMPT, response_format=response_format, max_tokens=4
        )

    assert (refused.value.code, refused.value.param) == ("invalid_request", "response_format")
    assert named in refused.value.message


SELF_REFERENCE = {"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}


@pytest.mark.parametrize(
    "schema",
    [SELF_REFERENCE, {"$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}]}}, "$ref": "#/$defs/A"}],
    ids=["only-a-ref", "through-allof"],
)
def test_a_schema_no_answer_can_start_is_a_400_and_bans_no_honest_node(
    network: Network, schema: Any
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    for _ in range(3):  # before, each one banned the honest tail for longer
        refused = network.chat(model=TINY, messages=PROMPT, response_format=fmt, max_tokens=4)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "response_format"
        assert "$ref" in error["message"] or "no answer can start" in error["message"]

    started = time.monotonic()
    honest = network.chat(model=TINY, messages=PROMPT, max_tokens=4)
    assert honest.status_code == 200, honest.text
    assert time.monotonic() - started < 10


# --- tools ----------------------------------------------------------------------------

WEATHER_ARGUMENTS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_ARGUMENTS = {
    "type": "object",
    "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 12}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": WEATHER_ARGUMENTS,
        },
    },
    {"type": "function", "function": {"name": "time", "parameters": TIME_ARGUMENTS}},
]
SCHEMAS = {"weather": WEATHER_ARGUMENTS, "time": TIME_ARGUMENTS}
EOS = 258  # the tiny tokenizer's <|im_end|>
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Oslo?"}]


def assert_valid_calls(calls: Any) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_required_tool_call_carries_arguments_valid_for_its_function(
    client: openai.OpenAI,
) -> None:
    # One call each: a random model left to make several goes on to max_tokens.
    for seed in range(3):
        reply = client.chat.completions.create(
            model=TINY,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=300,
        )

        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        assert_valid_calls(choice.message.tool_calls)


def test_a_named_function_is_called_once_and_parallel_false_allows_one_call(
    client: openai.OpenAI,
) -> None:
    named = client.chat.completions.create(
        model=TINY,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "time"}},
        temperature=1.0,
        seed=4,
        max_tokens=200,
    )
    single = client.chat.completions.create(
        model=TINY,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=5,
        max_tokens=200,
    )

    [call] = named.choices[0].message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "time"
    assert_valid_calls([call])
    assert len(single.choices[0].message.tool_calls or []) == 1


def test_streamed_tool_calls_arrive_as_openai_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=TINY,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=6,
        max_tokens=300,
        stream=True,
    )
    content, deltas, finish = "", [], None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            deltas += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish

    # As OpenAI streams a call: a delta naming it, then its arguments.
    named, arguments = deltas
    assert (content, finish) == ("", "tool_calls")
    assert named.index == arguments.index == 0
    assert named.id and named.id.startswith("call_") and named.type == "function"
    assert named.function is not None and named.function.arguments == ""
    assert arguments.function is not None and arguments.id is None
    assert named.function.name in SCHEMAS
    jsonschema.validate(
        json.loads(arguments.function.arguments or ""), SCHEMAS[named.function.name]
    )


def test_auto_answers_either_text_or_valid_calls(client: openai.OpenAI) -> None:
    for seed in range(6):
        choice = client.chat.completions.create(
            model=TINY, messages=ASK, tools=TOOLS, temperature=1.0, seed=seed, max_tokens=60
        ).choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            assert_valid_calls(choice.message.tool_calls)
        else:  # text, which then never starts as a calls object would
            assert choice.message.content and not choice.message.content.startswith("{")


def test_a_tool_result_is_taken_in_the_next_request(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=TINY,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=300,
    )
    message = first.choices[0].message
    calls = message.tool_calls or []
    history: list[Any] = [
        *ASK,
        message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": call.id, "content": "12 C, rain"} for call in calls),
    ]

    # The random model's end-of-text barred, so the answer is 8 tokens of text.
    after: dict[str, Any] = {"tools": TOOLS, "tool_choice": "none", "max_tokens": 8}
    after |= {"temperature": 0, "logit_bias": {str(EOS): -100}}
    answer = client.chat.completions.create(model=TINY, messages=history, **after)
    alone = client.chat.completions.create(model=TINY, messages=ASK, **after)

    assert answer.choices[0].finish_reason == "length" and answer.choices[0].message.content
    assert answer.usage is not None and alone.usage is not None
    # The call and its result are in the prompt: the tiny tokenizer spells bytes.
    assert isinstance(calls[0], ChatCompletionMessageFunctionToolCall)
    written = len(json.dumps(calls[0].function.arguments)) + len("12 C, rain")
    assert answer.usage.prompt_tokens > alone.usage.prompt_tokens + written


PING: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "ping",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    }
]
# One token per byte: the calls object opens in 15 tokens, and each ping call
# (``{"name":"ping","arguments":{}}``) takes 30 and a comma; 90 tokens cut the third.
CLOSE_BRACKET = ord("]")


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_cut_after_two_complete_calls_returns_those_calls_as_length(
    client: openai.OpenAI, stream: bool
) -> None:
    # ``]`` barred: the list of calls never closes, so max_tokens cuts it.
    fields: dict[str, Any] = {"tools": PING, "tool_choice": "required", "max_tokens": 90}
    fields |= {"temperature": 0, "logit_bias": {str(CLOSE_BRACKET): -100}}

    if stream:
        chunks = list(
            client.chat.completions.create(model=TINY, messages=ASK, stream=True, **fields)
        )
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        deltas = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
        names = [d.function.name for d in deltas if d.function and d.function.name]
        arguments = [d.function.arguments for d in deltas if d.function and d.function.arguments]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        choice = client.chat.completions.create(model=TINY, messages=ASK, **fields).choices[0]
        content, finish = choice.message.content or "", choice.finish_reason
        calls = choice.message.tool_calls or []
        assert all(isinstance(call, ChatCompletionMessageFunctionToolCall) for call in calls)
        names = [call.function.name for call in calls]
        arguments = [call.function.arguments for call in calls]

    assert (content, finish) == ("", "length")
    assert names == ["ping", "ping"] and arguments == ["{}", "{}"]


@pytest.mark.parametrize(
    ("fields", "param", "named"),
    [
        ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools", "name"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "nope",
        ),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}]},
            "tools",
            "not",
        ),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format", "tools"),
    ],
)
def test_tools_that_cannot_be_used_are_a_400_naming_why(
    client: openai.OpenAI, fields: dict[str, Any], param: str, named: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=TINY, messages=ASK, max_tokens=4, **fields)

    assert (refused.value.code, refused.value.param) == ("invalid_request", param)
    assert named in refused.value.message
