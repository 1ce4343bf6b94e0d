"""Prefix reuse through the tracker (ADR-0027, "Tracker"), on real processes: one tracker,
the tiny model split over two nodes (head 0-1, tail 2-3).

The same long prompt twice with one key reuses the first's cached blocks: the
same greedy answer, ``prompt_tokens_details.cached_tokens`` > 0, billed at the
model's cached price and recorded on the request. Another key's identical
prompt reuses nothing — until the operator lets keys share the model's cache.
The Messages and Responses APIs report the same in their own usage fields.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from tests.support.network import Network, billed_request, start_network
from tests.support.nodes import TINY
from tracker_app.localnet import fresh_process_database, wait_until

# The tiny tokenizer is byte-level: several 32-token blocks shared by every request.
LONG = "You are a careful assistant. Answer briefly and cite nothing at all. " * 4
PROMPT_PRICE, CACHED_PRICE, COMPLETION_PRICE = Decimal("1"), Decimal("0.1"), Decimal("2")


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("prefix-reuse")
        for network in start_network(database_url, tmp, MESHNET_RATE_LIMIT_PER_MINUTE="10000"):
            network.add_node("head", TINY, (0, 1))
            network.add_node("tail", TINY, (2, 3))
            network.wait_for_route(TINY)
            network.query(
                "UPDATE nodes_app_languagemodel SET prompt_price_per_1k = %s, "
                "completion_price_per_1k = %s, cached_prompt_price_per_1k = %s WHERE key = %s",
                PROMPT_PRICE,
                COMPLETION_PRICE,
                CACHED_PRICE,
                TINY,
            )
            yield network


def ask(network: Network, key: str, **extra: Any) -> dict[str, Any]:
    """A greedy chat of the long prompt with ``key``, answered once both nodes ended its
    sessions (and kept what they may for the next)."""
    response = httpx.post(
        f"{network.url}/v1/chat/completions",
        json={
            "model": TINY,
            "messages": [{"role": "user", "content": LONG}],
            "max_tokens": 8,
            "temperature": 0,
            **extra,
        },
        headers=network.headers(key),
        timeout=180,
    )
    assert response.status_code == 200, response.text
    nodes = list(network.nodes.values())
    wait_until(lambda: all(node.health()["active_sessions"] == 0 for node in nodes))
    return dict(response.json())


def recorded(network: Network, answer: dict[str, Any]) -> tuple[int, int, int, Decimal]:
    """The request's recorded prompt, cached and completion tokens and its charge."""
    billed_request(network, answer["id"])
    [row] = network.query(
        "SELECT r.prompt_tokens, r.cached_tokens, r.completion_tokens, b.charge "
        "FROM tracker_app_chatrequest r JOIN tracker_app_billingrecord b "
        "ON b.request_id = r.id WHERE r.id = %s",
        answer["id"][-32:],
    )
    return int(row[0]), int(row[1]), int(row[2]), Decimal(row[3])


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_a_keys_repeated_prompt_reuses_its_prefix_and_pays_the_cached_price(
    network: Network,
) -> None:
    first = ask(network, network.api_key)
    second = ask(network, network.api_key)

    assert second["choices"][0]["message"] == first["choices"][0]["message"]
    assert cached(first) == 0
    prompt = second["usage"]["prompt_tokens"]
    assert prompt == first["usage"]["prompt_tokens"] > 64
    assert 0 < cached(second) < prompt and cached(second) % 32 == 0
    prompt_tokens, cached_tokens, completion_tokens, charge = recorded(network, second)
    assert (prompt_tokens, cached_tokens) == (prompt, cached(second))
    expected = (
        Decimal(prompt - cached_tokens) * PROMPT_PRICE
        + Decimal(cached_tokens) * CACHED_PRICE
        + Decimal(completion_tokens) * COMPLETION_PRICE
    ) / 1000
    assert charge == expected.quantize(Decimal("0.000001"))
    assert recorded(network, first)[1] == 0

    streamed = [
        payload
        for payload in network.stream(
            model=TINY, messages=[{"role": "user", "content": LONG}], max_tokens=8, temperature=0
        )
        if isinstance(payload, dict) and payload.get("usage")
    ]
    assert streamed[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == cached(second)


def test_another_key_reuses_nothing_until_the_operator_shares_the_models_cache(
    network: Network,
) -> None:
    ask(network, network.api_key)  # the first key's entries are there
    other = network.create_api_key("other")

    alone = ask(network, other)
    assert cached(alone) == 0

    network.query(
        "UPDATE nodes_app_languagemodel SET prefix_cache_shared = true WHERE key = %s", TINY
    )
    ask(network, network.api_key)  # left in the model's shared scope
    shared = ask(network, other)

    assert cached(shared) > 0
    assert shared["choices"][0]["message"] == alone["choices"][0]["message"]


def settled(network: Network, response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    nodes = list(network.nodes.values())
    wait_until(lambda: all(node.health()["active_sessions"] == 0 for node in nodes))
    return dict(response.json())


def test_the_messages_and_responses_apis_report_the_reused_prompt_in_their_own_usage(
    network: Network,
) -> None:
    network.query(
        "UPDATE nodes_app_languagemodel SET prefix_cache_shared = false WHERE key = %s", TINY
    )
    key = network.create_api_key("agents")  # a new key: nothing of its own cached yet
    messages = {
        "model": TINY,
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "user", "content": LONG + " (messages)"}],
    }
    responses = {
        "model": TINY,
        "max_output_tokens": 8,
        "temperature": 0,
        "input": LONG + " (responses)",
    }
    sends = [("/v1/messages", messages), ("/v1/responses", responses)] * 2
    answers = [
        settled(
            network,
            httpx.post(
                f"{network.url}{path}", json=body, headers=network.headers(key), timeout=180
            ),
        )
        for path, body in sends
    ]

    first_message, first_response, message, response = answers
    assert first_message["usage"]["cache_read_input_tokens"] == 0
    # One key, one scope, whatever the API: the Responses request reuses the long
    # prefix the Messages request left.
    assert first_response["usage"]["input_tokens_details"]["cached_tokens"] > 0
    assert 0 < message["usage"]["cache_read_input_tokens"] < message["usage"]["input_tokens"]
    assert message["content"] == first_message["content"]
    assert response["usage"]["input_tokens_details"]["cached_tokens"] > 0
    assert response["output"][0]["content"] == first_response["output"][0]["content"]
    _, cached_tokens, _, _ = recorded(network, response)
    assert cached_tokens == response["usage"]["input_tokens_details"]["cached_tokens"]
