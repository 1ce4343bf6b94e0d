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
    """A one-node route and a two-node route of the same model (each hop adds a few ms per
    token): after 40 chats the default policy expects >= 85 % on the faster one, and the
    slower one still holds samples recent enough to count (status proven)."""
    with (
        fresh_process_database() as database_url,
        network(database_url, tmp_path, REDIS_URL=None, **SETTINGS) as net,
    ):
        net.add_node("whole", TINY, (0, 3), wait=False)
        net.add_node("head", TINY, (0, 1), wait=False)
        net.add_node("tail", TINY, (2, 3), wait=False)
        net.wait_for_route(TINY)
        wait_until(
            lambda: len(routes(net.url, net.api_key)) == 2,
            timeout=30,
            what="both routes in the routing table",
        )

        served = Counter(chat(net.url, net.api_key)["meshnet"]["route"] for _ in range(40))
        table = routes(net.url, net.api_key)

    by_hops = {len(route["hops"]): route for route in table}
    one_node, two_nodes = by_hops[1], by_hops[2]
    assert table[0]["expected_share"] + table[1]["expected_share"] > 0.999
    assert one_node["tps"] > two_nodes["tps"]
    assert one_node["expected_share"] >= 0.85, table
    assert served[one_node["signature"]] > served[two_nodes["signature"]]
    assert (two_nodes["status"], two_nodes["samples"] >= 1) == ("proven", True)
