"""Issue 15: OpenAI parity through the official Python client, against a real tracker and
real tiny-model nodes.

One network for the module: a head (layers 0-1) and a tail (2-3), and a whole
node (0-3), so a request can pin the split route or the whole one and compare.
The tiny model's weights are seeded: the whole node and the split route hold
the same model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.databases import fresh_process_database
from tests.support.network import Network, start_network
from tests.support.nodes import TINY

PROMPT: list[Any] = [{"role": "user", "content": "Tell me about meshes."}]


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("openai-parity")
        for network in start_network(database_url, tmp, MESHNET_RATE_LIMIT_PER_MINUTE="10000"):
            network.add_node("head", TINY, (0, 1))
            network.add_node("tail", TINY, (2, 3))
            network.add_node("whole", TINY, (0, 3))
            network.wait_for_route(TINY)
            yield network


@pytest.fixture(scope="module")
def client(network: Network) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{network.url}/v1", api_key=network.api_key, max_retries=0)


def split(network: Network) -> dict[str, Any]:
    """Pins the head → tail route (Meshnet's ``route``, sent as an extra field)."""
    return {"route": [network.nodes["head"].node_id, network.nodes["tail"].node_id]}


def whole(network: Network) -> dict[str, Any]:
    return {"route": [network.nodes["whole"].node_id]}


def streamed_choices(stream: Any) -> tuple[dict[int, str], dict[int, str], Any]:
    """(text, finish_reason) per choice index, and the usage, of a streamed chat."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    return texts, finishes, usage


# --- n ------------------------------------------------------------------------------


def test_n_greedy_choices_are_each_the_single_answer_streamed_and_not(
    client: openai.OpenAI, network: Network
) -> None:
    common: dict[str, Any] = {"model": TINY, "messages": PROMPT, "max_tokens": 10}
    single = client.chat.completions.create(**common, temperature=0, extra_body=split(network))

    reply = client.chat.completions.create(**common, n=3, temperature=0, extra_body=split(network))
    texts, finishes, usage = streamed_choices(
        client.chat.completions.create(
            **common, n=3, temperature=0, stream=True, extra_body=split(network)
        )
    )

    answer = single.choices[0].message.content
    assert [(c.index, c.message.content) for c in reply.choices] == [
        (0, answer),
        (1, answer),
        (2, answer),
    ]
    assert texts == {0: answer, 1: answer, 2: answer}
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert single.usage is not None and reply.usage is not None and usage is not None
    assert reply.usage.prompt_tokens == usage.prompt_tokens == single.usage.prompt_tokens
    assert reply.usage.completion_tokens == usage.completion_tokens == 30


def test_n_sampled_choices_are_what_seed_seed_plus_one_give_alone(
    client: openai.OpenAI, network: Network
) -> None:
    common: dict[str, Any] = {
        "model": TINY,
        "messages": PROMPT,
        "max_tokens": 12,
        "temperature": 1.0,
        "extra_body": whole(network),
    }
    alone = [
        client.chat.completions.create(**common, seed=seed).choices[0].message.content
        for seed in (5, 6)
    ]

    reply = client.chat.completions.create(**common, seed=5, n=2)
    texts, _, _ = streamed_choices(
        client.chat.completions.create(**common, seed=5, n=2, stream=True)
    )

    assert alone[0] != alone[1]
    assert [c.message.content for c in reply.choices] == alone
    assert texts == {0: alone[0], 1: alone[1]}


def test_more_choices_than_the_tracker_serves_are_a_400_naming_n(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=TINY, messages=PROMPT, n=5)

    assert (refused.value.code, refused.value.param) == ("invalid_request", "n")
    assert "MESHNET_MAX_CHOICES" in refused.value.message


# --- what Meshnet does not do ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        ("tool_choice", "required"),
        ("response_format", {"type": "json_object"}),
        ("modalities", ["text", "audio"]),
        ("reasoning_effort", "high"),
        ("store", True),
    ],
)
def test_asking_for_what_meshnet_does_not_do_is_a_400_naming_it(
    client: openai.OpenAI, name: str, value: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=TINY, messages=PROMPT, max_tokens=4, **{name: value})

    assert (refused.value.code, refused.value.param) == ("unsupported_parameter", name)
    assert name in refused.value.message


def test_asking_for_nothing_meshnet_lacks_is_served(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=TINY,
        messages=PROMPT,
        max_tokens=4,
        tools=[],
        tool_choice="none",
        response_format={"type": "text"},
        store=False,
        extra_body={"a_field_openai_does_not_define": 1},
    )

    assert reply.usage is not None and reply.usage.completion_tokens == 4


def test_any_other_api_path_is_a_json_404_in_the_error_shape(
    client: openai.OpenAI, network: Network
) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model=TINY, input="meshes")
    answer = httpx.get(f"{network.url}/v1/files/abc/content", timeout=30)

    assert missing.value.code == "not_found"
    assert "/v1/embeddings" in missing.value.message
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["error"]["type"] == "invalid_request_error"
