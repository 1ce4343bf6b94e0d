"""Learned arms as the choice sees them: EWMA, decay, epochs, sample hygiene, merging."""

from __future__ import annotations

import math
import random

import pytest

from routing_app.learning.arms import (
    DEFAULT_SAMPLE_SPREAD,
    SAMPLE_SPREAD_BOUNDS,
    SPREAD_MIN_RESIDUALS,
    ArmState,
    ArmStatus,
)
from routing_app.learning.stats import RouteStatsStore
from routing_app.learning.sync import StatsSync
from routing_app.planning.route_plan import Hop, RoutePlan
from routing_app.policies.config import RoutePolicyConfig
from tests.support.routing import ManualClock

FULL = RoutePlan("m", 29, (Hop("full", "http://full", 0, 29),))


def sample(store, tps, *, plan=FULL, epoch=1, tokens=50):
    return store.arms.record_sample(
        model_key=plan.model_key,
        signature=plan.signature,
        epoch=epoch,
        output_tokens=tokens,
        tokens_per_second=tps,
    )


def view(store, plan=FULL, epoch=1):
    (arm,) = store.views(plans=[plan], epoch=epoch)
    return arm


def test_it_starts_an_arm_at_its_first_sample_with_unit_mass(store):
    assert sample(store, 40.0)

    arm = view(store)
    assert (arm.tps, arm.weight, arm.samples, arm.status) == (40.0, 1.0, 1, ArmStatus.PROVEN)


def test_it_averages_samples_taken_together(store):
    sample(store, 40.0)
    sample(store, 20.0)

    assert view(store).tps == pytest.approx(30.0)
    assert view(store).weight == pytest.approx(2.0)


def test_it_halves_the_sample_mass_every_half_life(store, clock):
    sample(store, 40.0)
    sample(store, 40.0)

    clock.advance(600.0)
    assert view(store).weight == pytest.approx(1.0)
    clock.advance(1200.0)
    assert view(store).weight == pytest.approx(0.25)


def test_it_demotes_an_arm_whose_mass_decayed_below_one_half(store, clock):
    sample(store, 40.0)

    clock.advance(599.0)
    assert view(store).status is ArmStatus.PROVEN
    clock.advance(2.0)
    assert view(store).status is ArmStatus.DECAYED
    assert view(store).tps == 40.0


def test_it_lets_a_fresh_sample_outweigh_decayed_history(store, clock):
    sample(store, 40.0)
    clock.advance(6000.0)  # ten half-lives: mass ~0.001

    sample(store, 10.0)

    assert view(store).tps == pytest.approx(10.0, abs=0.05)


def test_it_follows_a_change_of_speed_within_a_few_samples_however_long_the_history(store):
    for _ in range(200):
        sample(store, 100.0)

    for _ in range(5):
        sample(store, 20.0)

    # Each new sample weighs at least 0.2: 0.8**5 of the old value is left.
    assert view(store).tps == pytest.approx(20.0 + 80.0 * 0.8**5)


def test_it_marks_stats_of_an_older_epoch_stale_but_keeps_their_speed_for_display(store):
    sample(store, 40.0, epoch=1)

    arm = view(store, epoch=2)

    assert arm.status is ArmStatus.STALE
    assert arm.tps == 40.0
    assert arm.current_weight == 0.0


def test_it_restarts_an_arm_from_the_first_sample_of_a_newer_epoch(store):
    for _ in range(10):
        sample(store, 40.0, epoch=1)

    sample(store, 10.0, epoch=2)

    arm = view(store, epoch=2)
    assert (arm.tps, arm.weight, arm.samples, arm.status) == (10.0, 1.0, 1, ArmStatus.PROVEN)


def test_it_rejects_a_sample_measured_under_an_older_epoch_than_the_arms(store):
    sample(store, 40.0, epoch=3)

    assert not sample(store, 1.0, epoch=2)
    assert view(store, epoch=3).tps == 40.0


def test_it_rejects_near_empty_completions(store):
    assert not sample(store, 2.5, tokens=1)
    assert not sample(store, 19.0, tokens=7)

    assert view(store).status is ArmStatus.UNSAMPLED


def test_it_accepts_a_completion_of_exactly_the_minimum_tokens(store):
    assert sample(store, 19.0, tokens=8)


@pytest.mark.parametrize("tps", [0.0, -3.0, math.nan, math.inf])
def test_it_rejects_speeds_that_are_not_positive_numbers(store, tps):
    assert not sample(store, tps)


def test_it_takes_the_minimum_sample_size_from_the_config(clock):
    store = RouteStatsStore.from_config(RoutePolicyConfig(min_sample_tokens=20), clock=clock)

    assert not sample(store, 30.0, tokens=19)
    assert sample(store, 30.0, tokens=20)


OTHER = RoutePlan("m", 29, (Hop("other", "http://other", 0, 29),))


@pytest.mark.parametrize("spread", [0.12, 0.3, 0.45])
def test_it_learns_how_far_a_models_requests_stray_from_their_routes_speed(store, spread):
    rng = random.Random(7)
    for _ in range(400):
        sample(store, 40.0 * math.exp(rng.gauss(0.0, spread)))
        sample(store, 25.0 * math.exp(rng.gauss(0.0, spread)), plan=OTHER)

    assert view(store).sample_spread == pytest.approx(spread, rel=0.25)
    assert view(store, OTHER).sample_spread == view(store).sample_spread  # one per model


def test_it_keeps_the_default_spread_until_enough_samples_strayed(store):
    for tps in [40.0, 10.0] * (SPREAD_MIN_RESIDUALS // 2):  # the first sample teaches nothing
        sample(store, tps)

    assert view(store).sample_spread == DEFAULT_SAMPLE_SPREAD
    sample(store, 10.0)
    assert view(store).sample_spread == SAMPLE_SPREAD_BOUNDS[1]  # a factor 4 apart: the widest


def test_a_learned_spread_never_narrows_past_its_floor(store):
    for _ in range(50):
        sample(store, 40.0)

    assert view(store).sample_spread == SAMPLE_SPREAD_BOUNDS[0]


def test_a_route_that_changes_speed_widens_the_spread_within_a_few_samples(store):
    for _ in range(50):
        sample(store, 40.0)
    for _ in range(4):
        sample(store, 8.0)  # its node slowed down 5x

    assert view(store).sample_spread > DEFAULT_SAMPLE_SPREAD


def test_samples_of_a_newer_epoch_restart_the_arm_without_counting_as_strays(store):
    for _ in range(50):
        sample(store, 40.0)
    sample(store, 8.0, epoch=2)
    sample(store, 8.0, epoch=3)

    assert view(store, epoch=3).sample_spread == SAMPLE_SPREAD_BOUNDS[0]


def test_it_shows_a_route_without_samples_as_unsampled(store):
    arm = view(store)

    assert (arm.tps, arm.weight, arm.samples, arm.status) == (None, 0.0, 0, ArmStatus.UNSAMPLED)


def test_it_keeps_an_arm_however_old_until_the_prune_job_deletes_it(store, clock):
    sample(store, 40.0, plan=FULL)
    clock.advance(30 * 24 * 3600.0)

    StatsSync(store).sync()

    assert view(store, FULL).samples == 1


def test_it_merges_two_states_by_decayed_weight():
    early = ArmState(value=100.0, mass=1.0, at=0.0, epoch=1, samples=1)
    late = ArmState(value=200.0, mass=1.0, at=600.0, epoch=1, samples=1)

    merged = early.merged(late, half_life=600.0)

    assert merged.value == pytest.approx((0.5 * 100.0 + 1.0 * 200.0) / 1.5)
    assert (merged.mass, merged.at, merged.samples) == (pytest.approx(1.5), 600.0, 2)
    assert late.merged(early, half_life=600.0) == merged


def test_it_lets_a_newer_epoch_supersede_an_older_one_in_a_merge():
    old = ArmState(value=100.0, mass=9.0, at=0.0, epoch=1, samples=9)
    new = ArmState(value=10.0, mass=1.0, at=0.0, epoch=2, samples=1)

    assert old.merged(new, half_life=600.0) == new


def test_it_ignores_a_clock_that_steps_backwards():
    clock = ManualClock()
    store = RouteStatsStore(clock=clock)
    sample(store, 40.0)
    clock.advance(-100.0)

    assert view(store).weight == 1.0
