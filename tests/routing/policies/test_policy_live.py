"""The default route policy on a real network (ADR-0011): tiny-model nodes, a real tracker."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from tests.support.network import start_network
from tests.support.routing_processes import SETTINGS, TINY, chat, routes
from tracker_app.localnet import fresh_process_database, wait_until

network = contextmanager(start_network)


def test_the_faster_route_takes_nearly_all_traffic_while_the_slower_stays_measured(
    tmp_path: Path,
) -> None:
    """A one-node route and two two-node routes of the same model (head -> tail, and head
    -> the whole node's layers 2-3; each hop adds a few ms per token): after 40 chats the
    default policy expects >= 85 % on the one-node route, and the head -> tail route still
    holds samples recent enough to count (status proven)."""
    with (
        fresh_process_database() as database_url,
        network(database_url, tmp_path, REDIS_URL=None, **SETTINGS) as net,
    ):
        whole = net.add_node("whole", TINY, (0, 3), wait=False)
        head = net.add_node("head", TINY, (0, 1), wait=False)
        tail = net.add_node("tail", TINY, (2, 3), wait=False)
        net.wait_for_route(TINY)
        net.wait_for_nodes()
        wait_until(
            lambda: len(routes(net.url, net.api_key)) == 3,
            timeout=30,
            what="the three routes in the routing table",
        )

        served = Counter(chat(net.url, net.api_key)["meshnet"]["route"] for _ in range(40))
        table = routes(net.url, net.api_key)

    by_nodes = {tuple(hop["node_id"] for hop in route["hops"]): route for route in table}
    one_node, two_nodes = (
        by_nodes[(whole.node_id,)],
        by_nodes[(head.node_id, tail.node_id)],
    )
    assert sum(route["expected_share"] for route in table) > 0.999
    assert one_node["tps"] > two_nodes["tps"]
    assert one_node["expected_share"] >= 0.85, table
    assert served[one_node["signature"]] > sum(served.values()) / 2, served
    assert (two_nodes["status"], two_nodes["samples"] >= 1) == ("proven", True), table
