"""``response_format`` through the official OpenAI client, on a real tracker and a split
tiny-model route (head 0-1, tail 2-3): the tail follows the schema's grammar.

The tiny model's weights are random: every answer being valid JSON for its
schema is the constraint's doing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.network import Network, start_network
from tests.support.nodes import TINY
from tracker_app.localnet import fresh_process_database

PROMPT: list[Any] = [{"role": "user", "content": "Describe a person as JSON."}]


class Person(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=120)
    role: Literal["admin", "user"]


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("structured")
        for network in start_network(database_url, tmp, MESHNET_RATE_LIMIT_PER_MINUTE="10000"):
            network.add_node("head", TINY, (0, 1))
            network.add_node("tail", TINY, (2, 3))
            network.wait_for_route(TINY)
            yield network


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
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 9}},
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
        max_tokens=50,
    )

    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), schema)


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
