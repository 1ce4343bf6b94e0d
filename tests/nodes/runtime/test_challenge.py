"""The node's ``POST /v1/challenge`` in process: it proves its wallet at its endpoint."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.testclient import TestClient

from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.loading.shard import LoadedShard, load_shard
from nodes_app.runtime.server import NodeIdentity, create_app
from nodes_app.shared.signing import verify_challenge, wallet_of
from nodes_app.shared.sources import resolve_source

ENDPOINT = "http://127.0.0.1:7301"
NONCE = "0123456789abcdef" * 4
KEY = Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def shard() -> LoadedShard:
    torch.set_num_threads(1)
    return load_shard(
        model_key="tiny-random-llama",
        source=resolve_source("tiny-random-llama"),
        start=2,
        end=3,
        progress=False,
    )


@pytest.fixture(scope="module")
def client(shard: LoadedShard) -> Iterator[TestClient]:
    app = create_app(NodeService(shard, node_id="prover"), identity=NodeIdentity(KEY, ENDPOINT))
    with TestClient(app) as test_client:
        yield test_client


def test_a_node_signs_the_nonce_with_its_wallet_at_its_endpoint(client: TestClient) -> None:
    answer = client.post("/v1/challenge", json={"nonce": NONCE})

    assert answer.status_code == 200
    body = answer.json()
    assert body["wallet"] == wallet_of(KEY)
    assert verify_challenge(wallet_of(KEY), NONCE, ENDPOINT, body["signature"])
    assert not verify_challenge(wallet_of(KEY), NONCE, "http://127.0.0.1:7302", body["signature"])


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"nonce": "short"}, "invalid_nonce"),
        ({"nonce": NONCE.upper()}, "invalid_nonce"),
        ({"nonce": 12}, "invalid_nonce"),
        (["not", "an", "object"], "invalid_nonce"),
        ({"nonce": NONCE, "padding": "x" * 2000}, "invalid_request"),
    ],
)
def test_a_malformed_challenge_is_refused_with_400(
    client: TestClient, body: object, code: str
) -> None:
    answer = client.post("/v1/challenge", json=body)

    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == code


def test_a_node_without_a_wallet_answers_404_no_wallet(shard: LoadedShard) -> None:
    with TestClient(create_app(NodeService(shard, node_id="walletless"))) as walletless:
        answer = walletless.post("/v1/challenge", json={"nonce": NONCE})

    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "no_wallet"
