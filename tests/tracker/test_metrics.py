"""GET /metrics: a token when one is set, else a direct loopback client only."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client, override_settings
from rest_framework import status

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"])
def test_without_a_token_a_direct_loopback_client_gets_the_metrics(address: str) -> None:
    response = Client(REMOTE_ADDR=address).get("/metrics")

    assert response.status_code == status.HTTP_200_OK


@pytest.mark.parametrize(
    "header",
    [
        "HTTP_X_FORWARDED_FOR",
        "HTTP_FORWARDED",
        "HTTP_X_REAL_IP",
        "HTTP_X_FORWARDED_HOST",
        "HTTP_X_FORWARDED_PROTO",
    ],
)
def test_without_a_token_a_forwarded_request_is_refused_even_from_loopback(header: str) -> None:
    meta: dict[str, Any] = {"REMOTE_ADDR": "127.0.0.1", header: "127.0.0.1"}
    response = Client(**meta).get("/metrics")

    assert response.status_code == status.HTTP_403_FORBIDDEN
    assert "forwarded" in response.json()["error"]["message"]


@override_settings(MESHNET_BEHIND_PROXY=True)
def test_without_a_token_nobody_gets_the_metrics_behind_a_proxy() -> None:
    response = Client(REMOTE_ADDR="127.0.0.1").get("/metrics")

    assert response.status_code == status.HTTP_403_FORBIDDEN
    assert "MESHNET_BEHIND_PROXY" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "address",
    ["10.1.2.3", "192.168.0.9", "203.0.113.5", "2001:4860::8888", "169.254.169.254", "nonsense"],
)
def test_without_a_token_other_addresses_are_refused_private_ones_too(address: str) -> None:
    response = Client(REMOTE_ADDR=address).get("/metrics")

    assert response.status_code == status.HTTP_403_FORBIDDEN
    assert response.json()["error"]["code"] == "metrics_private"


@override_settings(MESHNET_METRICS_TOKEN="a-metrics-token-of-some-length")
def test_with_a_token_even_loopback_must_send_it() -> None:
    client = Client(REMOTE_ADDR="127.0.0.1")

    assert client.get("/metrics").status_code == status.HTTP_401_UNAUTHORIZED
    authorized = client.get("/metrics", HTTP_AUTHORIZATION="Bearer a-metrics-token-of-some-length")
    assert authorized.status_code == status.HTTP_200_OK
