"""Proven endpoints: each registration attack against a real tracker, refused.

A real ``runtracker`` (daphne), a real tiny-model ``runnode`` for the honest
node, a real Celery worker for the periodic jobs. Nodes that only need to
exist (impostors, fake heads) answer challenges from a loopback
``ChallengeResponder`` in this process, holding the wallet keys they were
given — exactly what a node's ``/v1/challenge`` does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.shared.signing import wallet_of
from tests.support.network import Network, Tracker, running_tracker, start_network
from tests.support.nodes import TINY
from tracker_app.localnet import free_port, fresh_process_database, wait_until
from tracker_app.localnet.stand_in_nodes import (
    ChallengeResponder,
    challenge_responder,
    proven_registration,
    signed_registration,
)

# The networks the narrow tracker allows: a public range, and link-local ones
# an operator might list by mistake (they stay refused), but not loopback.
NARROW_NETWORKS = "10.0.0.0/8,203.0.113.0/24,169.254.0.0/16,fe80::/10"


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """A tracker with default policy and one honest node serving the whole tiny model."""
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("endpoints")
        for network in start_network(database_url, tmp, MESHNET_NODE_HEARTBEAT_INTERVAL="0.5"):
            network.add_node("honest", TINY, (0, 3))
            yield network


@pytest.fixture(scope="module")
def narrow(
    process_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tracker]:
    """A tracker whose MESHNET_NODE_NETWORKS leaves out loopback (nothing registers here)."""
    tmp = tmp_path_factory.mktemp("narrow")
    with running_tracker(process_database_url, tmp, MESHNET_NODE_NETWORKS=NARROW_NETWORKS) as t:
        yield t


def register(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/api/nodes/register", json=body, timeout=30)


def assert_refused(response: httpx.Response, status: int, code: str) -> dict[str, str]:
    assert response.status_code == status, response.text
    error: dict[str, str] = response.json()["error"]
    assert error["code"] == code
    return error


def nodes_of(net: Network, key: Ed25519PrivateKey) -> list[tuple[Any, ...]]:
    return net.query("SELECT id, status FROM nodes_app_node WHERE wallet = %s", wallet_of(key))


def test_an_impostor_wallet_cannot_register_an_honest_running_nodes_endpoint(
    net: Network,
) -> None:
    honest = net.nodes["honest"]
    impostor = Ed25519PrivateKey.generate()

    taken = register(net.url, signed_registration(impostor, endpoint=honest.endpoint))
    # Spelled differently it is the same socket, and the node there signs with its
    # own wallet, not the impostor's.
    respelled = honest.endpoint.replace("127.0.0.1", "localhost")
    unproven = register(net.url, signed_registration(impostor, endpoint=respelled))

    # The impostor is not told that a node runs there: that is for whoever proves it.
    assert_refused(taken, 403, "endpoint_unproven")
    error = assert_refused(unproven, 403, "endpoint_unproven")
    assert f"localhost:{honest.port}" in error["message"]
    assert nodes_of(net, impostor) == []
    # The honest node keeps its work: requests run through it and its units are its own.
    answer = net.chat(model=TINY, messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
    assert answer.status_code == 200, answer.text
    assert [hop["node_id"] for hop in answer.json()["meshnet"]["hops"]] == [honest.node_id]
    assert {row[0] for row in net.query("SELECT node_id FROM tracker_app_workunit")} == {
        honest.node_id
    }


@pytest.mark.parametrize(
    ("respell", "status", "code"),
    [
        (lambda endpoint: endpoint.replace("127.0.0.1", "localhost"), 403, "node_banned"),
        (lambda endpoint: endpoint + "/again", 400, "endpoint_not_allowed"),
    ],
    ids=["localhost", "path"],
)
def test_a_banned_node_cannot_come_back_under_another_spelling_of_its_endpoint(
    net: Network, responder: ChallengeResponder, respell: Any, status: int, code: str
) -> None:
    banned_key = Ed25519PrivateKey.generate()
    banned = register(net.url, proven_registration(responder, banned_key)).json()
    net.query("UPDATE nodes_app_node SET status = 'banned' WHERE id = %s", banned["node_id"])
    # Its operator restarts it with a new wallet, advertising another spelling.
    newcomer = Ed25519PrivateKey.generate()
    spelled = respell(responder.endpoint_for(banned_key))
    responder.hand_over(spelled, newcomer)

    back = register(net.url, signed_registration(newcomer, endpoint=spelled))

    assert_refused(back, status, code)
    assert nodes_of(net, newcomer) == []


def test_one_port_serves_one_node_not_one_wallet_per_path(
    net: Network, responder: ChallengeResponder
) -> None:
    first = Ed25519PrivateKey.generate()
    owned = register(net.url, proven_registration(responder, first))
    assert owned.status_code == 201, owned.text
    endpoint = responder.endpoint_for(first)
    wallets = [Ed25519PrivateKey.generate() for _ in range(3)]
    for index, key in enumerate(wallets):
        responder.hand_over(f"{endpoint}/wallet-{index}", key)

    refused = [
        register(net.url, signed_registration(key, endpoint=f"{endpoint}/wallet-{index}"))
        for index, key in enumerate(wallets)
    ]

    for answer in refused:
        error = assert_refused(answer, 400, "endpoint_not_allowed")
        assert "without a path" in error["message"]
    assert all(nodes_of(net, key) == [] for key in wallets)


def test_every_failed_proof_is_the_same_refusal_whatever_answers_at_the_port(
    net: Network, responder: ChallengeResponder
) -> None:
    """Closed, another server, the tracker itself, another wallet's node: one answer."""
    other = Ed25519PrivateKey.generate()
    assert register(net.url, proven_registration(responder, other)).status_code == 201
    probed = {
        "closed": f"http://127.0.0.1:{free_port()}",
        "a server answering 404": responder.url,
        "the tracker": net.url,
        "a running node of another wallet": net.nodes["honest"].endpoint,
        "a stand-in of another wallet": responder.endpoint_for(other),
    }

    answers = {
        what: register(net.url, signed_registration(endpoint=endpoint))
        for what, endpoint in probed.items()
    }

    refusals = set()
    for what, answer in answers.items():
        error = assert_refused(answer, 403, "endpoint_unproven")
        refusals.add(error["message"].replace(probed[what], "<endpoint>"))
    assert len(refusals) == 1, refusals
    (refusal,) = refusals
    assert not any(word in refusal for word in ("HTTP", "Error", "404", "taken"))


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://[fe80::1]:7001",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:169.254.169.254]:80",
        "http://metadata.google.internal/computeMetadata/v1",
        "http://0.0.0.0:7001",
    ],
)
def test_link_local_and_metadata_endpoints_are_refused_even_where_the_setting_lists_them(
    narrow: Tracker, endpoint: str
) -> None:
    started = time.monotonic()

    refused = register(narrow.url, signed_registration(endpoint=endpoint))

    assert_refused(refused, 400, "endpoint_not_allowed")
    assert time.monotonic() - started < 3  # refused on the address, not after a challenge


def test_a_public_address_is_refused_by_default(net: Network) -> None:
    refused = register(net.url, signed_registration(endpoint="http://8.8.8.8:7001"))

    error = assert_refused(refused, 400, "endpoint_not_allowed")
    assert "MESHNET_NODE_NETWORKS" in error["message"]


def test_an_endpoint_outside_the_allowed_networks_is_refused_without_any_connection(
    narrow: Tracker,
) -> None:
    key = Ed25519PrivateKey.generate()
    with challenge_responder() as listener:
        refused = register(narrow.url, proven_registration(listener, key))

        assert_refused(refused, 400, "endpoint_not_allowed")
        assert listener.connections == 0


def test_a_public_range_listed_in_the_setting_is_admitted_and_must_then_prove_itself(
    narrow: Tracker,
) -> None:
    # No node of this wallet serves at 203.0.113.7 (TEST-NET-3): reaching the
    # challenge at all shows the setting admitted the address. A successful
    # registration from an allowed public range is in test_registry_api.py.
    refused = register(narrow.url, signed_registration(endpoint="http://203.0.113.7:7001"))

    assert_refused(refused, 403, "endpoint_unproven")


def test_an_endpoint_belongs_to_one_wallet_and_only_its_prover_learns_it_is_taken(
    net: Network, responder: ChallengeResponder
) -> None:
    first, second = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    owned = register(net.url, proven_registration(responder, first)).json()
    endpoint = responder.endpoint_for(first)

    stranger = register(net.url, signed_registration(second, endpoint=endpoint))
    assert_refused(stranger, 403, "endpoint_unproven")
    # The operator moved the machine to a new wallet while the old node still runs.
    responder.hand_over(endpoint, second)
    taken = register(net.url, signed_registration(second, endpoint=endpoint))
    assert_refused(taken, 409, "endpoint_taken")

    httpx.post(
        f"{net.url}/api/nodes/{owned['node_id']}/deregister",
        headers={"Authorization": f"Bearer {owned['node_token']}"},
    )
    moved = register(net.url, signed_registration(second, endpoint=endpoint))
    assert moved.status_code == 201, moved.text


def test_a_ban_follows_the_wallet_to_another_shard_and_the_endpoint_to_another_wallet(
    net: Network, responder: ChallengeResponder
) -> None:
    banned_key = Ed25519PrivateKey.generate()
    banned = register(net.url, proven_registration(responder, banned_key)).json()
    net.query("UPDATE nodes_app_node SET status = 'banned' WHERE id = %s", banned["node_id"])
    endpoint = responder.endpoint_for(banned_key)
    elsewhere = responder.new_endpoint(banned_key)

    other_shard = register(
        net.url, signed_registration(banned_key, endpoint=elsewhere, shard_end=1)
    )
    newcomer = Ed25519PrivateKey.generate()
    responder.hand_over(endpoint, newcomer)
    new_wallet = register(net.url, signed_registration(newcomer, endpoint=endpoint))

    assert_refused(other_shard, 403, "node_banned")
    assert_refused(new_wallet, 403, "node_banned")
    assert responder.answered[elsewhere] == 0
    assert nodes_of(net, newcomer) == []


def test_a_speed_claim_is_bounded_and_stops_winning_once_a_measurement_exists(
    net: Network, responder: ChallengeResponder
) -> None:
    absurd = register(net.url, proven_registration(responder, benchmark_tps=1e12))
    assert_refused(absurd, 400, "benchmark_out_of_range")

    fake = Ed25519PrivateKey.generate()
    claimed = register(net.url, proven_registration(responder, fake, benchmark_tps=1e5)).json()
    honest = net.nodes["honest"].node_id

    def best_head() -> tuple[str, float]:
        table = httpx.get(f"{net.url}/v1/routing?model={TINY}", headers=net.headers()).json()
        best = table["models"][0]["routes"][0]
        return best["hops"][0]["node_id"], best["prior_tps"]

    try:
        wait_until(lambda: best_head()[0] == claimed["node_id"], what="the claim to rank first")
        beat = httpx.post(
            f"{net.url}/api/nodes/{claimed['node_id']}/heartbeat",
            json={"active_sessions": 0, "queue_depth": 0, "measured_tps": 2.0},
            headers={"Authorization": f"Bearer {claimed['node_token']}"},
        )
        assert beat.status_code == 200, beat.text

        wait_until(lambda: best_head()[0] == honest, what="the measured node to rank first")
        table = httpx.get(f"{net.url}/v1/routing?model={TINY}", headers=net.headers()).json()
        priors = {
            route["hops"][0]["node_id"]: route["prior_tps"]
            for route in table["models"][0]["routes"]
        }
        assert priors[claimed["node_id"]] <= 2.0
    finally:
        httpx.post(
            f"{net.url}/api/nodes/{claimed['node_id']}/deregister",
            headers={"Authorization": f"Bearer {claimed['node_token']}"},
        )


@pytest.fixture
def upkept(tmp_path: Path) -> Iterator[Network]:
    """A tracker and a worker that re-proves endpoints and prunes rows every second."""
    settings = {
        "MESHNET_NODE_REPROOF_INTERVAL": "1",
        "MESHNET_NODE_PRUNE_INTERVAL": "1",
        "MESHNET_NODE_RETENTION": "60",
        # Long enough that the liveness sweep never explains a node going offline.
        "MESHNET_NODE_HEARTBEAT_TIMEOUT": "600",
    }
    with fresh_process_database() as database_url:
        yield from start_network(database_url, tmp_path, **settings)


def test_the_worker_takes_a_node_whose_endpoint_stopped_proving_offline_and_prunes_old_rows(
    upkept: Network, responder: ChallengeResponder
) -> None:
    keys = {name: Ed25519PrivateKey.generate() for name in ("steady", "lost", "old", "banned")}
    nodes = {
        name: register(upkept.url, proven_registration(responder, key)).json()
        for name, key in keys.items()
    }
    ids = {name: node["node_id"] for name, node in nodes.items()}
    long_ago = (datetime.now(UTC) - timedelta(days=2)).isoformat(sep=" ")
    upkept.query(
        "UPDATE nodes_app_node SET status = 'offline', last_heartbeat_at = %s WHERE id = %s",
        long_ago,
        ids["old"],
    )
    upkept.query(
        "UPDATE nodes_app_node SET status = 'banned', last_heartbeat_at = %s WHERE id = %s",
        long_ago,
        ids["banned"],
    )
    lost_endpoint = responder.endpoint_for(keys["lost"])
    responder.forget(lost_endpoint)  # that endpoint no longer answers for the wallet

    def status(name: str) -> str | None:
        rows = upkept.query("SELECT status FROM nodes_app_node WHERE id = %s", ids[name])
        return str(rows[0][0]) if rows else None

    worker = upkept.start_worker("--pool", "solo")
    wait_until(
        lambda: status("lost") == "offline" and status("old") is None,
        timeout=90,
        what="the re-proof and the prune",
        interval=0.5,
        process=worker,
    )

    assert (status("steady"), status("banned")) == ("online", "banned")
    reasons = upkept.query("SELECT reason FROM nodes_app_topologyepoch")
    assert any("endpoint re-proof" in row[0] for row in reasons)
    # A heartbeat does not bring it back until the endpoint proves the wallet again.
    lost = nodes["lost"]

    def heartbeat() -> httpx.Response:
        return httpx.post(
            f"{upkept.url}/api/nodes/{lost['node_id']}/heartbeat",
            json={"active_sessions": 0, "queue_depth": 0},
            headers={"Authorization": f"Bearer {lost['node_token']}"},
            timeout=30,
        )

    assert_refused(heartbeat(), 403, "endpoint_unproven")
    assert status("lost") == "offline"
    responder.hand_over(lost_endpoint, keys["lost"])
    assert heartbeat().status_code == 200
    assert status("lost") == "online"
