"""GET /metrics: a token when one is set, else private client addresses only."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings
from rest_framework import status

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "10.1.2.3", "172.20.0.4", "192.168.0.9", "::1", "::ffff:10.0.0.1"]
)
def test_without_a_token_private_addresses_get_the_metrics(address: str) -> None:
    response = Client(REMOTE_ADDR=address).get("/metrics")

    assert response.status_code == status.HTTP_200_OK


@pytest.mark.parametrize(
    "address", ["203.0.113.5", "8.8.8.8", "2001:4860::8888", "169.254.169.254", "nonsense"]
)
def test_without_a_token_public_addresses_are_refused(address: str) -> None:
    response = Client(REMOTE_ADDR=address).get("/metrics")

    assert response.status_code == status.HTTP_403_FORBIDDEN
    assert response.json()["error"]["code"] == "metrics_private"


@override_settings(MESHNET_METRICS_TOKEN="a-metrics-token-of-some-length")
def test_with_a_token_even_loopback_must_send_it() -> None:
    client = Client(REMOTE_ADDR="127.0.0.1")

    assert client.get("/metrics").status_code == status.HTTP_401_UNAUTHORIZED
    authorized = client.get("/metrics", HTTP_AUTHORIZATION="Bearer a-metrics-token-of-some-length")
    assert authorized.status_code == status.HTTP_200_OK
