"""A node's speed claims (its registration's benchmark, its heartbeats' tokens/s) against
what the tracker measured: a claim never draws traffic from a measured node.

A real tracker (daphne) and a real tiny-model node, measured through real
chats; the liar is a stand-in endpoint that proves its wallet and claims
10⁶ tok/s at registration and in every heartbeat.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.support.network import Network, start_network
from tests.support.nodes import TINY
from tests.support.routing_processes import SETTINGS
from tracker_app.localnet import fresh_process_database, wait_until
from tracker_app.localnet.stand_in_nodes import ChallengeResponder, proven_registration

CLAIM = 1e6


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """A tracker and one honest node serving the whole tiny model."""
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("claims")
        for network in start_network(database_url, tmp, **SETTINGS):
            network.add_node("honest", TINY, (0, 3))
            yield network


def shares_by_head(net: Network) -> dict[str, tuple[str, float]]:
    """Each route's (status, expected share), keyed by its head node."""
    return {
        route["hops"][0]["node_id"]: (route["status"], route["expected_share"])
        for route in net.routes(TINY)
    }


def test_a_node_claiming_a_million_tokens_a_second_does_not_outrank_a_measured_node(
    net: Network, responder: ChallengeResponder
) -> None:
    honest = net.nodes["honest"].node_id
    for _ in range(4):
        answer = net.chat(model=TINY, messages=[{"role": "user", "content": "Hi"}], max_tokens=16)
        assert answer.status_code == 200, answer.text
    wait_until(lambda: shares_by_head(net)[honest][0] == "proven", what="a measured route")

    liar_key = Ed25519PrivateKey.generate()
    liar = httpx.post(
        f"{net.url}/api/nodes/register",
        json=proven_registration(responder, liar_key, benchmark_tps=CLAIM),
        timeout=30,
    )
    assert liar.status_code == 201, liar.text
    registered = liar.json()
    beat = httpx.post(
        f"{net.url}/api/nodes/{registered['node_id']}/heartbeat",
        json={"active_sessions": 0, "queue_depth": 0, "measured_tps": CLAIM},
        headers={"Authorization": f"Bearer {registered['node_token']}"},
        timeout=30,
    )
    assert beat.status_code == 200, beat.text
    wait_until(lambda: registered["node_id"] in shares_by_head(net), what="the liar's route")

    shares = shares_by_head(net)
    # At most an honest newcomer's chance of being tried: never the measured route's traffic.
    assert shares[registered["node_id"]][1] <= 0.6, shares
    assert shares[honest][1] >= 0.4, shares
