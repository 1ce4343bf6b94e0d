"""How many drafts a head sends: from the route's measured timing and the answer's acceptance."""

from __future__ import annotations

import math

import pytest

from nodes_app.runtime.head.speculation import (
    MAX_DRAFTS,
    PROBE_DRAFTS,
    PROBE_EVERY,
    DraftPolicy,
    RouteTiming,
    TimingBook,
    best_drafts,
    expected_rate,
)


def test_a_fast_local_route_does_not_speculate() -> None:
    # Loopback: a step is its compute, and each extra position costs a good share of it.
    assert best_drafts(0.5, plain=0.004, per_draft=0.002) == 0
    assert best_drafts(0.9, plain=0.004, per_draft=0.004) == 0


def test_a_slow_link_speculates_as_far_as_the_text_is_accepted() -> None:
    # A 40 ms round trip, 1 ms of compute per extra position.
    repetitive = best_drafts(0.9, plain=0.045, per_draft=0.001)
    story = best_drafts(0.3, plain=0.045, per_draft=0.001)

    assert repetitive == MAX_DRAFTS
    assert 0 < story < repetitive
    assert best_drafts(0.02, plain=0.045, per_draft=0.004) == 0


def test_a_route_is_measured_plain_first_then_by_a_probe_round() -> None:
    policy = DraftPolicy(RouteTiming())
    assert policy.drafts() == 0

    policy.record_plain(0.045)
    assert policy.drafts() == PROBE_DRAFTS

    policy.record_round(PROBE_DRAFTS, PROBE_DRAFTS, 0.048)
    assert policy.timing.per_draft is not None
    assert policy.drafts() > PROBE_DRAFTS


def test_a_generation_that_stopped_speculating_probes_again_after_plain_steps() -> None:
    policy = DraftPolicy(RouteTiming(plain=0.004, per_draft=0.004))
    for _ in range(6):
        policy.record_round(3, 0, 0.016)
    assert policy.drafts() == 0

    for _ in range(PROBE_EVERY):
        policy.record_plain(0.004)

    assert policy.drafts() == PROBE_DRAFTS


def test_a_probe_is_planned_first_and_a_dearer_proposer_promises_fewer_tokens() -> None:
    """How a head with a draft model chooses between it and prompt lookup (ADR-0028)."""
    unmeasured = DraftPolicy(RouteTiming(plain=0.045))
    free = DraftPolicy(RouteTiming(plain=0.045, per_draft=0.001))
    dear = DraftPolicy(RouteTiming(plain=0.045, per_draft=0.03))

    assert unmeasured.plan() == (PROBE_DRAFTS, math.inf)
    drafts, rate = free.plan()
    assert drafts > 0 and rate == expected_rate(0.5, 0.045, 0.001, drafts)
    assert dear.plan() == (0, pytest.approx(1 / 0.045))
    assert rate > dear.plan()[1]


def test_acceptance_counts_each_draft_given_the_ones_before_it_were_accepted() -> None:
    policy = DraftPolicy(RouteTiming())
    policy.record_round(4, 2, 0.05)  # two accepted, the third rejected, the fourth unseen
    policy.record_round(2, 2, 0.05)

    assert policy.accepted == 4 and policy.rejected == 1
    assert policy.acceptance == (4 + 1) / (5 + 2)


def test_each_route_keeps_its_own_timing_and_old_routes_are_forgotten() -> None:
    book = TimingBook(kept=2)
    book.of("a").record_plain(0.01)
    book.of("b")
    book.of("c")

    assert book.of("a").plain is None
    assert book.of("c") is book.of("c")
