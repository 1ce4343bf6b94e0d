"""The route policy and a slow link between hosts (ADR-0011): real tiny-model nodes, a real tracker.

A whole node (layers 0-3), a head (0-1) and a tail (2-3) reachable only
through a delay link of 20 ms each way (40 ms round trip, a link between
cities): the tail advertises the link's address, so the tracker's endpoint
proof, its probes and the head's hop link all cross it. Each token of a
route through the tail pays that round trip, so such a route cannot exceed
1000 / 40 = 25 tokens/s; the whole node alone serves hundreds. The policy
is judged on what a client sees: which route served each chat, and the
table ``/v1/routing`` publishes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support.network import Network, start_network
from tests.support.redis_db import private_redis
from tests.support.routing_processes import SETTINGS, TINY, chat, routes
from tracker_app.localnet import LOOPBACK, free_port, fresh_process_database, wait_until
from tracker_app.localnet.delay_link import DelayLink

ONE_WAY_MS = 20
CHATS = 30
network = contextmanager(start_network)


@pytest.fixture(scope="module")
def slow_tail(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[tuple[Network, DelayLink, str]]:
    """The three nodes, the tail behind the delay link; yields the network, the link and
    the tail's node id once both kinds of route are in the routing table. The tracker
    keeps its route statistics in a Redis database of its own."""
    tail_port = free_port()
    with (
        fresh_process_database() as database_url,
        network(
            database_url,
            tmp_path_factory.mktemp("slow-link"),
            REDIS_URL=private_redis(redis_url),
            **SETTINGS,
        ) as net,
        DelayLink((LOOPBACK, tail_port), one_way_ms=ONE_WAY_MS) as link,
    ):
        net.add_node("whole", TINY, (0, 3), wait=False)
        net.add_node("head", TINY, (0, 1), wait=False)
        tail = net.add_node(
            "tail", TINY, (2, 3), port=tail_port, extra=("--advertise", link.url), wait=False
        )
        net.wait_for_route(TINY)

        def both_kinds() -> bool:
            table = routes(net.url, net.api_key)
            through_tail = [r for r in table if tail.node_id in r["signature"]]
            return bool(through_tail) and any(len(r["hops"]) == 1 for r in table)

        wait_until(both_kinds, timeout=90, what="a one-hop route and a route through the tail")
        yield net, link, tail.node_id


def test_a_node_behind_a_delay_link_advertises_the_link_and_proves_its_endpoint_through_it(
    slow_tail: tuple[Network, DelayLink, str],
) -> None:
    net, link, tail_id = slow_tail

    rows = net.query("SELECT endpoint, status FROM nodes_app_node WHERE id = %s", tail_id)

    assert rows == [(link.url, "online")]
    assert link.connections >= 1  # the tracker's challenge reached the tail through the link


def test_a_slow_link_sends_most_chats_to_the_one_hop_route(
    slow_tail: tuple[Network, DelayLink, str],
) -> None:
    """After 30 chats at least two thirds went to a one-hop route; every route through the
    tail was measured below the 25 tokens/s its link's round trip allows, and the one-hop
    route above it."""
    net, _, tail_id = slow_tail

    served = Counter(chat(net.url, net.api_key)["meshnet"]["route"] for _ in range(CHATS))
    table = routes(net.url, net.api_key)

    one_hop = {r["signature"] for r in table if len(r["hops"]) == 1}
    through_tail = [r for r in table if tail_id in r["signature"]]
    ceiling = 1000 / (2 * ONE_WAY_MS)
    assert sum(served[signature] for signature in one_hop) >= 2 * CHATS / 3, (served, table)
    assert all(r["tps"] is None or r["tps"] < ceiling for r in through_tail), through_tail
    assert all(r["tps"] > ceiling for r in table if r["signature"] in one_hop), table
