"""The node registry API as a node and an impostor see it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from rest_framework import status
from rest_framework.test import APIClient

from nodes_app.models import LanguageModel, Node, NodeStatus
from nodes_app.selectors import topology_epoch_current
from nodes_app.shared.signing import sign_registration
from tracker_app.localnet.stand_in_nodes import ChallengeResponder, proven_registration

pytestmark = pytest.mark.django_db


@pytest.fixture
def client() -> APIClient:
    return APIClient()


def epoch(key: str = "tiny-random-llama") -> int:
    return topology_epoch_current(model=LanguageModel.objects.get(key=key))


def register(client: APIClient, body: dict[str, Any]) -> Any:
    return client.post("/api/nodes/register", body, format="json")


def assert_error(response: Any, status_code: int, code: str, words: str) -> None:
    assert response.status_code == status_code, response.content
    error = response.json()["error"]
    assert error["code"] == code
    assert words in error["message"]
    assert set(error) == {"message", "type", "code"}


def test_it_accepts_a_signed_registration_and_returns_a_node_token(
    client: APIClient, responder: ChallengeResponder
) -> None:
    before = epoch()
    response = register(client, proven_registration(responder))

    assert response.status_code == status.HTTP_201_CREATED, response.content
    body = response.json()
    node = Node.objects.get(pk=body["node_id"])
    assert node.status == NodeStatus.ONLINE
    assert (node.shard_start, node.shard_end) == (0, 3)
    assert body["node_token"] and body["node_token"] not in node.token_hash
    assert body["epoch"] == before + 1 == epoch()
    assert body["node"]["model"] == "tiny-random-llama"


def test_it_refuses_a_forged_signature(client: APIClient, responder: ChallengeResponder) -> None:
    victim = Ed25519PrivateKey.generate()
    body = proven_registration(responder, Ed25519PrivateKey.generate())
    body["wallet"] = proven_registration(responder, victim)["wallet"]  # claim someone else's wallet

    assert_error(register(client, body), 401, "invalid_signature", "does not match")
    assert not Node.objects.exists()


def test_it_refuses_a_registration_whose_fields_were_changed_after_signing(
    client: APIClient, responder: ChallengeResponder
) -> None:
    body = proven_registration(responder)
    body["endpoint"] = "http://attacker.example:9999"

    assert_error(register(client, body), 401, "invalid_signature", "does not match")


def test_it_refuses_a_replayed_old_registration(
    client: APIClient, responder: ChallengeResponder
) -> None:
    body = proven_registration(responder, timestamp=time.time() - 3600)

    assert_error(register(client, body), 401, "stale_registration", "clock")


def test_it_refuses_layers_outside_the_model(
    client: APIClient, responder: ChallengeResponder
) -> None:
    body = proven_registration(responder, shard_start=2, shard_end=4)

    assert_error(register(client, body), 400, "layers_out_of_range", "outside")
    assert "0-3" in register(client, body).json()["error"]["message"]
    assert not Node.objects.exists()


def test_it_refuses_a_layer_count_that_disagrees_with_the_catalogue(
    client: APIClient, responder: ChallengeResponder
) -> None:
    body = proven_registration(responder, num_layers=30)

    assert_error(register(client, body), 400, "layer_count_mismatch", "catalogue says 4")


def test_it_refuses_an_unknown_model_naming_the_known_ones(
    client: APIClient, responder: ChallengeResponder
) -> None:
    body = proven_registration(responder, model="gpt-17")

    assert_error(register(client, body), 400, "unknown_model", "smollm2-135m")


def test_it_explains_malformed_fields(client: APIClient, responder: ChallengeResponder) -> None:
    body = proven_registration(responder, shard_start=3, shard_end=1)

    assert_error(register(client, body), 400, "invalid_request", "shard_end")


def test_it_answers_bad_json_in_the_error_shape(client: APIClient) -> None:
    response = client.post("/api/nodes/register", data="{not json", content_type="application/json")

    assert_error(response, 400, "invalid_json", "JSON")


def test_a_heartbeat_with_the_node_token_records_live_load(
    client: APIClient, responder: ChallengeResponder
) -> None:
    registered = register(client, proven_registration(responder)).json()

    response = client.post(
        f"/api/nodes/{registered['node_id']}/heartbeat",
        {
            "active_sessions": 2,
            "queue_depth": 1,
            "measured_tps": 31.5,
            "prefix_cache_load": 0.25,
            "prefix_hits": 7,
        },
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {registered['node_token']}",
    )

    assert response.status_code == status.HTTP_200_OK, response.content
    assert (response.json()["prefix_cache_load"], response.json()["prefix_hits"]) == (0.25, 7)
    node = Node.objects.get(pk=registered["node_id"])
    assert (node.active_sessions, node.queue_depth, node.measured_tps) == (2, 1, 31.5)
    assert (node.prefix_cache_load, node.prefix_hits) == (0.25, 7)


def test_a_heartbeat_without_prefix_cache_figures_records_an_empty_cache(
    client: APIClient, responder: ChallengeResponder
) -> None:
    registered = register(client, proven_registration(responder)).json()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {registered['node_token']}")
    url = f"/api/nodes/{registered['node_id']}/heartbeat"
    beat = {"active_sessions": 0, "queue_depth": 0, "prefix_cache_load": 0.5, "prefix_hits": 3}
    client.post(url, beat, format="json")

    # A node older than the prefix cache sends neither figure.
    response = client.post(url, {"active_sessions": 1, "queue_depth": 0}, format="json")

    assert response.status_code == status.HTTP_200_OK, response.content
    node = Node.objects.get(pk=registered["node_id"])
    assert (node.active_sessions, node.prefix_cache_load, node.prefix_hits) == (1, 0.0, 0)


def test_it_refuses_a_heartbeat_with_a_wrong_token(
    client: APIClient, responder: ChallengeResponder
) -> None:
    registered = register(client, proven_registration(responder)).json()

    response = client.post(
        f"/api/nodes/{registered['node_id']}/heartbeat",
        {"active_sessions": 0, "queue_depth": 0},
        format="json",
        HTTP_AUTHORIZATION="Bearer not-the-token",
    )

    assert_error(response, 401, "invalid_node_token", "wrong node token")


def test_it_refuses_a_heartbeat_without_a_token(
    client: APIClient, responder: ChallengeResponder
) -> None:
    registered = register(client, proven_registration(responder)).json()

    response = client.post(
        f"/api/nodes/{registered['node_id']}/heartbeat",
        {"active_sessions": 0, "queue_depth": 0},
        format="json",
    )

    assert_error(response, 401, "missing_node_token", "Bearer")


def test_deregistering_takes_the_node_offline_and_bumps_the_epoch(
    client: APIClient, responder: ChallengeResponder
) -> None:
    registered = register(client, proven_registration(responder)).json()
    before = epoch()

    response = client.post(
        f"/api/nodes/{registered['node_id']}/deregister",
        HTTP_AUTHORIZATION=f"Bearer {registered['node_token']}",
    )

    assert response.status_code == status.HTTP_204_NO_CONTENT
    assert Node.objects.get(pk=registered["node_id"]).status == NodeStatus.OFFLINE
    assert epoch() == before + 1


def test_a_restart_with_the_same_shard_keeps_the_id_and_the_epoch(
    client: APIClient, responder: ChallengeResponder
) -> None:
    key = Ed25519PrivateKey.generate()
    first = register(client, proven_registration(responder, key)).json()
    before = epoch()

    again = register(client, proven_registration(responder, key)).json()

    assert again["node_id"] == first["node_id"]
    assert epoch() == before
    assert Node.objects.count() == 1


def test_a_shard_change_makes_a_new_node_retires_the_old_and_bumps_once(
    client: APIClient, responder: ChallengeResponder
) -> None:
    key = Ed25519PrivateKey.generate()
    old = register(client, proven_registration(responder, key, shard_start=0, shard_end=3)).json()
    before = epoch()

    new = register(client, proven_registration(responder, key, shard_start=0, shard_end=1)).json()

    assert new["node_id"] != old["node_id"]
    assert Node.objects.get(pk=old["node_id"]).status == NodeStatus.OFFLINE
    assert Node.objects.get(pk=new["node_id"]).status == NodeStatus.ONLINE
    assert epoch() == before + 1
    assert "shard change" in LanguageModel.objects.get(key="tiny-random-llama").epoch.reason


def test_epochs_are_per_model(client: APIClient, responder: ChallengeResponder) -> None:
    smol_before = epoch("smollm2-135m")

    register(client, proven_registration(responder))

    assert epoch("smollm2-135m") == smol_before


def test_a_banned_node_cannot_register_again(
    client: APIClient, responder: ChallengeResponder
) -> None:
    key = Ed25519PrivateKey.generate()
    registered = register(client, proven_registration(responder, key)).json()
    Node.objects.filter(pk=registered["node_id"]).update(status=NodeStatus.BANNED)

    assert_error(
        register(client, proven_registration(responder, key)), 403, "node_banned", "banned"
    )


def test_a_captured_registration_cannot_be_replayed(
    client: APIClient, responder: ChallengeResponder
) -> None:
    body = proven_registration(responder)
    assert register(client, body).status_code == status.HTTP_201_CREATED

    assert_error(register(client, body), 401, "replayed_registration", "already used")


def test_a_registration_may_leave_out_optional_fields(
    client: APIClient, responder: ChallengeResponder
) -> None:
    body = proven_registration(responder)
    del body["device_name"]
    key = Ed25519PrivateKey.generate()
    fields = {
        k: v
        for k, v in proven_registration(responder, key).items()
        if k not in ("signature", "device_name")
    }
    body = {**fields, "signature": sign_registration(key, fields)}

    response = register(client, body)

    assert response.status_code == status.HTTP_201_CREATED, response.content
    assert response.json()["node"]["device_name"] == ""


def test_a_registration_records_the_nodes_precision(
    client: APIClient, responder: ChallengeResponder
) -> None:
    response = register(client, proven_registration(responder, precision="bfloat16+int8"))

    assert response.status_code == status.HTTP_201_CREATED, response.content
    assert response.json()["node"]["precision"] == "bfloat16+int8"
    assert Node.objects.get(pk=response.json()["node_id"]).precision == "bfloat16+int8"


def test_a_node_that_does_not_say_its_precision_is_recorded_as_float32(
    client: APIClient, responder: ChallengeResponder
) -> None:
    response = register(client, proven_registration(responder))

    assert response.status_code == status.HTTP_201_CREATED, response.content
    assert Node.objects.get(pk=response.json()["node_id"]).precision == "float32"


def test_it_refuses_an_unknown_precision(client: APIClient, responder: ChallengeResponder) -> None:
    body = proven_registration(responder, precision="float8")

    assert_error(register(client, body), 400, "invalid_request", "precision")


def test_layers_sent_as_numeric_strings_are_read_as_numbers(
    client: APIClient, responder: ChallengeResponder
) -> None:
    key = Ed25519PrivateKey.generate()
    fields = {k: v for k, v in proven_registration(responder, key).items() if k != "signature"}
    fields["shard_end"] = "3"
    body = {**fields, "signature": sign_registration(key, fields)}

    response = register(client, body)

    assert response.status_code == status.HTTP_201_CREATED, response.content
    assert Node.objects.get(pk=response.json()["node_id"]).shard_end == 3


def test_it_refuses_an_implausible_benchmark_claim(
    client: APIClient, responder: ChallengeResponder
) -> None:
    body = proven_registration(responder, benchmark_tps=1e12)

    assert_error(register(client, body), 400, "benchmark_out_of_range", "tokens/s")
    assert not Node.objects.exists()


def test_it_stores_the_endpoint_in_one_spelling(
    client: APIClient, responder: ChallengeResponder
) -> None:
    key = Ed25519PrivateKey.generate()
    endpoint = responder.endpoint_for(key)

    response = register(client, proven_registration(responder, key, endpoint=endpoint + "/"))

    assert response.status_code == status.HTTP_201_CREATED, response.content
    assert Node.objects.get(pk=response.json()["node_id"]).endpoint == endpoint


def test_it_refuses_an_endpoint_whose_node_does_not_prove_the_wallet(
    client: APIClient, responder: ChallengeResponder
) -> None:
    elsewhere = responder.endpoint_for(Ed25519PrivateKey.generate())
    body = proven_registration(responder, endpoint=elsewhere)

    assert_error(register(client, body), 403, "endpoint_unproven", elsewhere)
    assert not Node.objects.exists()
