"""Numbers a node reports are bounded: a registration or a heartbeat carrying a number out
of any sane range is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from tracker_app.localnet.stand_in_nodes import ChallengeResponder, proven_registration


@pytest.fixture
def client() -> APIClient:
    return APIClient()


def registered(client: APIClient, responder: ChallengeResponder) -> tuple[str, str]:
    response = client.post("/api/nodes/register", proven_registration(responder), format="json")
    assert response.status_code == 201, response.content
    return response.json()["node_id"], response.json()["node_token"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("active_sessions", 10**20),
        ("active_sessions", 1e20),
        ("queue_depth", 10**20),
        ("queue_depth", -1),
        ("measured_tps", 1e308),
        ("measured_tps", 10**400),
        ("prefix_cache_load", 1.25),
        ("prefix_cache_load", -0.25),
        ("prefix_cache_load", "full"),
        ("prefix_hits", -1),
        ("prefix_hits", 10**20),
    ],
)
def test_a_heartbeat_with_an_absurd_number_is_a_400_naming_it(
    client: APIClient, responder: ChallengeResponder, field: str, value: Any
) -> None:
    node_id, token = registered(client, responder)
    body = {"active_sessions": 1, "queue_depth": 0, "measured_tps": 10.0, field: value}

    response = client.post(
        f"/api/nodes/{node_id}/heartbeat",
        body,
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )

    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["message"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [("benchmark_tps", 1e12), ("shard_end", 10**20), ("num_layers", 10**20)],
)
def test_a_registration_with_an_absurd_number_is_a_400_naming_it(
    client: APIClient, responder: ChallengeResponder, field: str, value: Any
) -> None:
    response = client.post(
        "/api/nodes/register", proven_registration(responder, **{field: value}), format="json"
    )

    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["message"]
    if field == "benchmark_tps":
        # One rule for a speed claim: the service's MESHNET_NODE_MAX_BENCHMARK_TPS cap.
        assert response.json()["error"]["code"] == "benchmark_out_of_range"
