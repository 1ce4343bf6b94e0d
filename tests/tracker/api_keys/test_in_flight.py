"""Each API key's share of requests and KV tokens in flight: leases in the database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from meshnet_site.errors import http_error
from tracker_app.api_keys.in_flight import (
    RequestOverKeyShare,
    TooManyKvTokensInFlight,
    TooManyRequestsInFlight,
    key_in_flight,
    key_lease_release,
    key_lease_renew,
    key_lease_take,
)
from tracker_app.api_keys.services import api_key_create
from tracker_app.models import ApiKey

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def take(api_key: ApiKey, kv_tokens: int, *, now: datetime = NOW) -> uuid.UUID:
    request_id = uuid.uuid4()
    key_lease_take(api_key=api_key, request_id=request_id, kv_tokens=kv_tokens, now=now, seconds=60)
    return request_id


@override_settings(MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT=2, MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT=1000)
def test_a_key_past_its_requests_in_flight_is_refused_saying_so_until_one_ends() -> None:
    key = api_key_create(name="k").api_key
    first = take(key, 10)
    take(key, 10)

    with pytest.raises(TooManyRequestsInFlight) as refused:
        take(key, 10)

    answer = http_error(refused.value)
    assert (answer.status, answer.body["error"]["code"]) == (429, "too_many_requests_in_flight")
    assert answer.headers["Retry-After"] == "1"
    key_lease_release(request_id=first)
    take(key, 10)


@override_settings(MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT=10, MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT=1000)
def test_a_key_past_its_kv_tokens_in_flight_is_refused_and_other_keys_are_not() -> None:
    greedy, other = api_key_create(name="greedy").api_key, api_key_create(name="other").api_key
    take(greedy, 700)

    with pytest.raises(TooManyKvTokensInFlight) as refused:
        take(greedy, 301)

    assert "700" in refused.value.message and "1000" in refused.value.message
    take(greedy, 300)
    take(other, 1000)
    assert key_in_flight(api_key=greedy, now=NOW).kv_tokens == 1000


@override_settings(MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT=1000)
def test_a_request_larger_than_its_keys_whole_share_is_a_400_not_a_wait() -> None:
    key = api_key_create(name="k").api_key

    with pytest.raises(RequestOverKeyShare) as refused:
        take(key, 1001)

    assert http_error(refused.value).status == 400
    assert refused.value.param == "max_tokens"


@override_settings(MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT=1, MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT=1000)
def test_a_keys_own_limits_override_the_deployments() -> None:
    key = api_key_create(name="k").api_key
    key.max_requests_in_flight, key.max_kv_tokens_in_flight = 3, 50
    key.save()
    take(key, 20)
    take(key, 20)

    with pytest.raises(TooManyKvTokensInFlight):
        take(key, 20)


@override_settings(MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT=1)
def test_a_lease_not_renewed_expires_and_a_renewed_one_holds() -> None:
    key = api_key_create(name="k").api_key
    lapsed = take(key, 10)

    renewed = take(key, 10, now=NOW + timedelta(seconds=61))  # the first expired: room again

    assert not key_lease_renew(request_id=lapsed, now=NOW + timedelta(seconds=61), seconds=60)
    assert key_lease_renew(request_id=renewed, now=NOW + timedelta(seconds=100), seconds=60)
    with pytest.raises(TooManyRequestsInFlight):
        take(key, 10, now=NOW + timedelta(seconds=150))


@override_settings(MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT=16, MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT=32768)
def test_the_admin_shows_each_keys_limits_and_what_it_has_in_flight() -> None:
    own = api_key_create(name="own-limits").api_key
    own.max_requests_in_flight = 2
    own.save()
    default = api_key_create(name="defaults").api_key
    take(default, 4100, now=datetime.now(UTC))
    admin = get_user_model().objects.create_superuser("root", "root@localhost", "pw")
    client = Client()
    client.force_login(admin)

    listing = client.get("/admin/tracker_app/apikey/").content.decode()
    page = client.get(f"/admin/tracker_app/apikey/{own.pk}/change/").content.decode()

    assert "1 / 16 (default)" in listing and "4100 / 32768 (default)" in listing
    assert "0 / 2<" in listing
    assert 'name="max_requests_in_flight"' in page and 'name="max_kv_tokens_in_flight"' in page
