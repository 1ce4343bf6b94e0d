"""The durable guards: a value is claimed once, a window counts every hit, expiry prunes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshnet_site.guards.models import OnceClaim, WindowCounter
from meshnet_site.guards.services import (
    claim_once,
    count_hit,
    guards_prune,
    window_retry_after,
    window_start,
)
from meshnet_site.guards.tasks import prune_guards

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 6, 1, 12, 0, 30, tzinfo=UTC)  # in the past: the prune job uses the clock
LATER = NOW + timedelta(minutes=5)


def fresh(prefix: str) -> str:
    """A key no other example used: hypothesis runs its examples in one test transaction."""
    return f"{prefix}-{uuid.uuid4().hex}"


def test_a_value_is_claimed_once_until_its_claim_expires() -> None:
    assert claim_once("registration", "sig-1", until=LATER, now=NOW) is True
    assert claim_once("registration", "sig-1", until=LATER, now=NOW) is False
    assert (
        claim_once("registration", "sig-1", until=LATER, now=LATER - timedelta(seconds=1)) is False
    )

    assert claim_once("registration", "sig-1", until=LATER + timedelta(minutes=5), now=LATER)
    assert claim_once("registration", "sig-1", until=LATER, now=LATER) is False


def test_claims_of_different_scopes_do_not_meet() -> None:
    assert claim_once("registration", "same", until=LATER, now=NOW)
    assert claim_once("challenge", "same", until=LATER, now=NOW)


def test_only_a_digest_of_the_claimed_value_is_stored() -> None:
    claim_once("registration", "a-secret-signature", until=LATER, now=NOW)

    [claim] = OnceClaim.objects.all()
    assert "a-secret-signature" not in claim.digest
    assert len(claim.digest) == 64


def test_a_claim_outlives_any_number_of_other_claims() -> None:
    """The attack on the cache: 320 registrations evicted the replay guard. Rows are not
    evicted."""
    claim_once("registration", "victim", until=LATER, now=NOW)
    for index in range(1000):
        assert claim_once("registration", f"flood-{index}", until=LATER, now=NOW)

    assert claim_once("registration", "victim", until=LATER, now=NOW) is False


@settings(max_examples=50, deadline=None)
@given(hits=st.integers(min_value=1, max_value=30), window=st.sampled_from([1, 60, 3600]))
def test_a_window_counts_every_hit_from_one(hits: int, window: int) -> None:
    key = fresh("counter")

    assert [count_hit(key, window_seconds=window, now=NOW) for _ in range(hits)] == list(
        range(1, hits + 1)
    )


@settings(max_examples=50, deadline=None)
@given(offset=st.floats(min_value=0, max_value=10_000, allow_nan=False), window=st.integers(1, 600))
def test_the_next_window_starts_counting_again_after_retry_after(
    offset: float, window: int
) -> None:
    key = fresh("counter")
    now = NOW + timedelta(seconds=offset)
    count_hit(key, window_seconds=window, now=now)
    count_hit(key, window_seconds=window, now=now)

    retry_after = window_retry_after(window_seconds=window, now=now)
    assert 1 <= retry_after <= window
    next_window = now + timedelta(seconds=retry_after)
    assert window_start(window_seconds=window, now=next_window) > window_start(
        window_seconds=window, now=now
    )
    assert count_hit(key, window_seconds=window, now=next_window) == 1


def test_counters_of_different_keys_do_not_meet() -> None:
    count_hit("registration:10.0.0.1", window_seconds=60, now=NOW)
    count_hit("registration:10.0.0.1", window_seconds=60, now=NOW)

    assert count_hit("registration:10.0.0.2", window_seconds=60, now=NOW) == 1


def test_a_counter_key_too_long_to_store_is_refused_not_truncated() -> None:
    with pytest.raises(ValueError, match="longer than 200"):
        count_hit("k" * 201, window_seconds=60, now=NOW)


def test_pruning_deletes_only_expired_claims_and_counters() -> None:
    claim_once("registration", "old", until=NOW, now=NOW - timedelta(minutes=1))
    claim_once("registration", "live", until=LATER, now=NOW)
    count_hit("old-window", window_seconds=60, now=NOW - timedelta(minutes=2))
    count_hit("live-window", window_seconds=60, now=NOW)

    pruned = guards_prune(now=NOW + timedelta(seconds=1))

    assert pruned.to_dict() == {"claims": 1, "counters": 1}
    assert claim_once("registration", "live", until=LATER, now=NOW) is False
    assert list(WindowCounter.objects.values_list("key", flat=True)) == ["live-window"]


def test_the_prune_job_removes_what_expired() -> None:
    claim_once("registration", "long-gone", until=NOW, now=NOW - timedelta(minutes=1))

    assert prune_guards() == {"claims": 1, "counters": 0}
    assert not OnceClaim.objects.exists()
