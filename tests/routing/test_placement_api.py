"""GET /v1/placement (the plan, for clients and staff) and GET /api/nodes/placement (the
offer, for a node about to join)."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from rest_framework import status
from rest_framework.test import APIClient

from tests.support.routing import make_model, make_node
from tracker_app.api_keys.services import api_key_create

pytestmark = pytest.mark.django_db


def key_client() -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(name='client').plain}")
    return client


def staff_client() -> APIClient:
    client = APIClient()
    client.force_login(
        User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", password="x", is_staff=True)
    )
    return client


def test_a_client_sees_stages_capacity_gaps_and_the_offer() -> None:
    model = make_model(num_layers=8)
    make_node(model, "head-a", 0, 1, tps=100.0)
    make_node(model, "head-b", 0, 1, tps=50.0, measured_tps=40.0)
    make_node(model, "mid", 2, 5, tps=30.0)
    make_node(model, "gone", 6, 7, tps=30.0, status="offline")

    response = key_client().get("/v1/placement", {"model": model.key, "layers": "1"})

    assert response.status_code == status.HTTP_200_OK, response.content
    assert response.json() == {
        "model": model.key,
        "num_layers": 8,
        "stages": [
            {
                "start_layer": 0,
                "end_layer": 1,
                "node_ids": ["head-a", "head-b"],
                "node_count": 2,
                "capacity_tps": 140.0,
            },
            {
                "start_layer": 2,
                "end_layer": 5,
                "node_ids": ["mid"],
                "node_count": 1,
                "capacity_tps": 30.0,
            },
        ],
        "uncovered": [{"start_layer": 6, "end_layer": 7}],
        "layers": 1,
        "offer": {
            "start_layer": 6,
            "end_layer": 6,
            "rule": "uncovered",
            "reason": "layers 6-7 are served by no node; this node holds 1 of its 2 layers",
        },
    }


def test_staff_see_the_least_capacity_stage_offered_once_every_layer_is_served() -> None:
    model = make_model(num_layers=4)
    make_node(model, "head", 0, 1, tps=100.0)
    make_node(model, "tail", 2, 3, tps=20.0)

    body = staff_client().get("/v1/placement", {"model": model.key}).json()

    assert body["layers"] is None
    assert body["offer"] == {
        "start_layer": 2,
        "end_layer": 3,
        "rule": "least_capacity",
        "reason": "every layer is served; stage 2-3 has the least capacity "
        "(20.0 tok/s over 1 node)",
    }


def test_the_plan_needs_an_api_key_or_a_staff_session() -> None:
    model = make_model(num_layers=4)

    anonymous = APIClient().get("/v1/placement", {"model": model.key})
    assert anonymous.status_code == status.HTTP_401_UNAUTHORIZED
    assert anonymous.json()["error"]["code"] == "invalid_api_key"

    member = APIClient()
    member.force_login(User.objects.create_user("member", password="x"))
    refused = member.get("/v1/placement", {"model": model.key})
    assert refused.status_code == status.HTTP_403_FORBIDDEN
    assert refused.json()["error"]["code"] == "staff_only"


def test_an_unknown_model_is_a_documented_404() -> None:
    response = key_client().get("/v1/placement", {"model": "no-such-model"})

    assert response.status_code == status.HTTP_404_NOT_FOUND
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("model_not_found", "invalid_request_error")


@pytest.mark.parametrize(
    ("query", "code"),
    [({}, "invalid_request"), ({"model": "x", "layers": "many"}, "invalid_request")],
)
def test_a_missing_model_or_a_layer_count_that_is_no_number_is_a_400(query, code) -> None:
    response = key_client().get("/v1/placement", query)

    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert response.json()["error"]["code"] == code


def test_a_node_that_holds_no_layer_is_told_so() -> None:
    model = make_model(num_layers=4)

    response = APIClient().get("/api/nodes/placement", {"model": model.key, "layers": "0"})

    assert response.status_code == status.HTTP_400_BAD_REQUEST
    error = response.json()["error"]
    assert error["code"] == "node_too_small"
    assert "holds no whole layer" in error["message"]


def test_a_joining_node_gets_its_offer_without_credentials() -> None:
    model = make_model(num_layers=4)
    make_node(model, "head", 0, 1)

    response = APIClient().get("/api/nodes/placement", {"model": model.key, "layers": "2"})

    assert response.status_code == status.HTTP_200_OK
    assert response.json() == {
        "model": model.key,
        "num_layers": 4,
        "start_layer": 2,
        "end_layer": 3,
        "rule": "uncovered",
        "reason": "layers 2-3 are served by no node",
    }


def test_both_endpoints_are_in_the_openapi_schema() -> None:
    paths = APIClient().get("/api/schema/", {"format": "json"}).json()["paths"]

    assert set(paths["/v1/placement"]["get"]["responses"]) >= {"200", "400", "401", "403", "404"}
    assert "security" not in paths["/api/nodes/placement"]["get"]  # no credential


@override_settings(MESHNET_PLACEMENT_RATE_LIMIT=3)
def test_an_address_past_its_anonymous_placement_limit_gets_429_with_retry_after() -> None:
    model = make_model(num_layers=4)
    client = APIClient()
    for _ in range(3):
        ok = client.get("/api/nodes/placement", {"model": model.key}, REMOTE_ADDR="203.0.113.7")
        assert ok.status_code == status.HTTP_200_OK

    refused = client.get("/api/nodes/placement", {"model": model.key}, REMOTE_ADDR="203.0.113.7")

    assert refused.status_code == status.HTTP_429_TOO_MANY_REQUESTS
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("placement_rate_limited", "rate_limit_error")
    assert "at most 3 per minute" in error["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    other = client.get("/api/nodes/placement", {"model": model.key}, REMOTE_ADDR="198.51.100.9")
    assert other.status_code == status.HTTP_200_OK
