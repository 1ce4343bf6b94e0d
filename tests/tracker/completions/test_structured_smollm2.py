"""Structured output and a tool call from a real instruct model: SmolLM2 split over two
node processes (the session's network), through the official OpenAI client."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from pydantic import BaseModel

from tests.support.network import Network
from tests.support.nodes import SMOLLM2

pytestmark = pytest.mark.model


class Capital(BaseModel):
    country: str
    capital: str


def split(network: Network) -> dict[str, Any]:
    return {"route": [network.nodes["head"].node_id, network.nodes["tail"].node_id]}


@pytest.fixture
def client(smollm2_network: Network) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{smollm2_network.url}/v1", api_key=smollm2_network.api_key, max_retries=0
    )


def test_smollm2_answers_a_schema_with_the_right_fact(
    client: openai.OpenAI, smollm2_network: Network
) -> None:
    reply = client.chat.completions.parse(
        model=SMOLLM2,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format=Capital,
        temperature=0,
        max_tokens=40,
        extra_body=split(smollm2_network),
    )

    parsed = reply.choices[0].message.parsed
    assert parsed is not None
    assert parsed.capital == "Paris"


def test_smollm2_calls_the_tool_a_question_needs(
    client: openai.OpenAI, smollm2_network: Network
) -> None:
    weather: Any = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    reply = client.chat.completions.create(
        model=SMOLLM2,
        messages=[{"role": "user", "content": "What is the weather in Paris right now?"}],
        tools=[weather],
        tool_choice="required",
        # Left to list several, this small model repeats the call until max_tokens.
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=40,
        extra_body=split(smollm2_network),
    )

    [call] = reply.choices[0].message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "get_weather"
    assert "Paris" in json.loads(call.function.arguments)["city"]
