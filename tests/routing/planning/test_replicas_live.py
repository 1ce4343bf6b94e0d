"""Replicas carry traffic on a real network (ADR-0018): tiny-model nodes, a real
tracker, two heads and two tails, concurrent chats."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support.network import Network, start_network
from tests.support.routing_processes import PROMPT, SETTINGS, TINY
from tracker_app.localnet import fresh_process_database, wait_until

CHATS = 40
# Greedy and short: every answer must be the same on whichever route ran it.
network = contextmanager(start_network)
BODY = {"model": TINY, "messages": PROMPT, "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """Two heads (layers 0-1) and two tails (2-3) of the tiny model behind one tracker."""
    tmp = tmp_path_factory.mktemp("replicas")
    with (
        fresh_process_database() as database_url,
        network(database_url, tmp, REDIS_URL=None, **SETTINGS) as net,
    ):
        for name, layers in (("head-a", (0, 1)), ("head-b", (0, 1))):
            net.add_node(name, TINY, layers, wait=False)
        for name, layers in (("tail-a", (2, 3)), ("tail-b", (2, 3))):
            net.add_node(name, TINY, layers, wait=False)
        net.wait_for_route(TINY)
        wait_until(
            lambda: len(net.routes(TINY)) == 4, timeout=60, what="all four routes in the table"
        )
        yield net


def answer(net: Network, **extra: Any) -> dict[str, Any]:
    response = net.chat(**BODY, **extra)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_the_routing_table_lists_every_head_with_every_tail(replicas: Network) -> None:
    table = replicas.routes(TINY)

    pairs = {tuple(hop["node_id"] for hop in route["hops"]) for route in table}
    ids = {name: node.node_id for name, node in replicas.nodes.items()}
    assert pairs == {
        (ids[head], ids[tail]) for head in ("head-a", "head-b") for tail in ("tail-a", "tail-b")
    }


def test_concurrent_chats_use_every_node_and_answer_as_one_pinned_route(replicas: Network) -> None:
    """40 chats at once: every node serves at least 15 % of them, and every answer is the
    pinned route's, token for token (greedy decoding)."""
    ids = {name: node.node_id for name, node in replicas.nodes.items()}
    pinned = answer(replicas, route=[ids["head-a"], ids["tail-a"]])

    with ThreadPoolExecutor(CHATS) as pool:
        answers = list(pool.map(lambda _: answer(replicas), range(CHATS)))

    served = Counter(hop["node_id"] for a in answers for hop in a["meshnet"]["hops"])
    for name, node_id in ids.items():
        assert served[node_id] >= 0.15 * CHATS, (name, served)
    expected = pinned["choices"][0]["message"]["content"]
    assert [a["choices"][0]["message"]["content"] for a in answers] == [expected] * CHATS
