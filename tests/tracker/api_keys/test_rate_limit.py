"""The per-API-key rate limit: a durable count per key and minute."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from tracker_app.api_keys.rate_limit import RateLimitExceeded, rate_limit_check

pytestmark = pytest.mark.django_db

WINDOW_OPENS = 1_764_547_200.0  # a whole minute, Unix time


def test_the_request_past_the_limit_is_refused_until_the_next_minute() -> None:
    for second in (0, 10, 20):
        rate_limit_check(key_hash="a" * 64, limit=3, now=WINDOW_OPENS + second)

    with pytest.raises(RateLimitExceeded) as refused:
        rate_limit_check(key_hash="a" * 64, limit=3, now=WINDOW_OPENS + 45.5)

    assert refused.value.code == "rate_limit_exceeded"
    assert refused.value.retry_after == 15
    rate_limit_check(key_hash="a" * 64, limit=3, now=WINDOW_OPENS + 60)


def test_each_key_has_its_own_count() -> None:
    rate_limit_check(key_hash="a" * 64, limit=1, now=WINDOW_OPENS)

    rate_limit_check(key_hash="b" * 64, limit=1, now=WINDOW_OPENS)


def test_the_count_does_not_live_in_the_cache() -> None:
    rate_limit_check(key_hash="a" * 64, limit=1, now=WINDOW_OPENS)
    cache.clear()

    with pytest.raises(RateLimitExceeded):
        rate_limit_check(key_hash="a" * 64, limit=1, now=WINDOW_OPENS + 1)
