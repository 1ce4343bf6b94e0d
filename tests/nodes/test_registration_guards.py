"""Registration's durable guards: the per-address limit and the replay guard, as a node
and a flooder see them."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache
from django.test import override_settings
from rest_framework import status
from rest_framework.test import APIClient

from nodes_app.registration_limit import client_network
from tracker_app.localnet.stand_in_nodes import ChallengeResponder, proven_registration

pytestmark = pytest.mark.django_db


def register(body: dict[str, Any], address: str = "203.0.113.7") -> Any:
    return APIClient().post("/api/nodes/register", body, format="json", REMOTE_ADDR=address)


@pytest.mark.parametrize(
    ("address", "counted_as"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
    ],
)
def test_a_client_is_counted_by_its_address_or_its_ipv6_64(address: str, counted_as: str) -> None:
    assert client_network(address) == counted_as


@override_settings(MESHNET_REGISTRATION_RATE_LIMIT=3)
def test_an_address_past_its_registration_limit_gets_429_with_retry_after(
    responder: ChallengeResponder,
) -> None:
    for _ in range(3):
        assert register(proven_registration(responder)).status_code == status.HTTP_201_CREATED

    refused = register(proven_registration(responder))

    assert refused.status_code == status.HTTP_429_TOO_MANY_REQUESTS
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("registration_rate_limited", "rate_limit_error")
    assert "at most 3 per minute" in error["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60


@override_settings(MESHNET_REGISTRATION_RATE_LIMIT=3)
def test_refused_registrations_count_too_so_a_flood_of_garbage_is_cut_off_early(
    responder: ChallengeResponder,
) -> None:
    for _ in range(3):
        assert register({"wallet": "not hex"}).status_code == status.HTTP_400_BAD_REQUEST

    assert register(proven_registration(responder)).status_code == status.HTTP_429_TOO_MANY_REQUESTS


@override_settings(MESHNET_REGISTRATION_RATE_LIMIT=1)
def test_another_address_keeps_its_own_registration_limit(responder: ChallengeResponder) -> None:
    assert register(proven_registration(responder), "198.51.100.1").status_code == 201
    assert register(proven_registration(responder), "198.51.100.1").status_code == 429

    assert register(proven_registration(responder), "198.51.100.2").status_code == 201


@override_settings(MESHNET_REGISTRATION_RATE_LIMIT=1)
def test_the_registration_limit_does_not_live_in_the_cache(responder: ChallengeResponder) -> None:
    assert register(proven_registration(responder)).status_code == 201
    cache.clear()

    assert register(proven_registration(responder)).status_code == 429


def test_a_replayed_registration_is_refused_even_after_the_cache_is_emptied(
    responder: ChallengeResponder,
) -> None:
    body = proven_registration(responder)
    assert register(body).status_code == 201
    cache.clear()

    replayed = register(body)

    assert replayed.status_code == status.HTTP_401_UNAUTHORIZED
    assert replayed.json()["error"]["code"] == "replayed_registration"
