"""Cache-aware routing on a real network (ADR-0029): two whole-model nodes of the tiny
model, equally fast, and a real tracker. A conversation's turns go back to the node
holding its history, which answers from its prefix cache."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.network import Network, start_network
from tests.support.routing_processes import SETTINGS, TINY, routes
from tracker_app.localnet import fresh_process_database, wait_until

network = contextmanager(start_network)
# The tiny tokenizer is byte-level: this is about 20 blocks of 32 tokens.
SYSTEM = "You are a careful assistant for a shipping company; answer in one line. " * 9
QUESTIONS = ["Where is my parcel?", "And the second one?", "Can it come sooner?"]
MORE = ["Who signs for it?", "Is Sunday possible?", "Thanks, anything else?"]


def chat(net: Network, messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    response = httpx.post(
        f"{net.url}/v1/chat/completions",
        json={"model": TINY, "messages": messages, "max_tokens": 8, "temperature": 0, **extra},
        headers=net.headers(),
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_conversation_goes_back_to_the_node_holding_its_history(tmp_path: Path) -> None:
    with (
        fresh_process_database() as database_url,
        network(database_url, tmp_path, REDIS_URL=None, **SETTINGS) as net,
    ):
        left = net.add_node("left", TINY, (0, 3), wait=False)
        right = net.add_node("right", TINY, (0, 3), wait=False)
        net.wait_for_nodes()
        wait_until(lambda: len(routes(net.url, net.api_key)) == 2, what="both routes listed")
        # Both routes measured (a chat pinned to each, prompts of their own), so the
        # policy draws between two proven routes rather than falling back on one.
        for node in (left, right, left, right):
            system = f"{node.node_id} {len(SYSTEM)} " + SYSTEM[::-1]
            chat(net, [{"role": "system", "content": system}], route=[node.node_id])

        messages = [{"role": "system", "content": SYSTEM}]
        turns = []
        for question in QUESTIONS + MORE:
            messages.append({"role": "user", "content": question})
            answer = chat(net, messages)
            # The nodes keep what a session computed as it ends, just after its answer.
            wait_until(lambda: all(n.health()["active_sessions"] == 0 for n in (left, right)))
            messages.append(
                {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
            )
            turns.append(answer)

    served = [turn["meshnet"]["route"] for turn in turns]
    cached = [turn["usage"]["prompt_tokens_details"]["cached_tokens"] for turn in turns]
    assert len(set(served)) == 1, served
    assert cached[0] == 0 and all(count >= 16 * 32 for count in cached[1:]), cached
