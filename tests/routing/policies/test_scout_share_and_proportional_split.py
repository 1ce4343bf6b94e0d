"""Scouting at a fixed share and splitting the rest in proportion to speed (the `adr0021`
policy, ADR-0021): greedy fallback, scouting at a share, exploiting P ∝ tps^alpha, and
never a quarantined arm."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from routing_app.planning.search import enumerate_routes
from routing_app.policies.choice import DecisionMode
from routing_app.policies.config import POLICY_ADR0021, RoutePolicyConfig
from tests.support.routing import learn, record

NODES = [
    record("fast", 0, 29, tps=300.0),
    record("slow", 0, 29, tps=200.0),
    record("third", 0, 29, tps=100.0),
]
PLANS = enumerate_routes(model_key="m", num_layers=30, nodes=NODES)
FAST, SLOW, THIRD = PLANS
DEFAULT = RoutePolicyConfig(policy=POLICY_ADR0021)


def draw(store, *, plans=PLANS, config=DEFAULT, n=4000, seed=7, epoch=1):
    """``n`` picks of the configured policy among ``plans``, one seeded random source."""
    rng = random.Random(seed)
    policy = config.route_policy()
    return [policy.choose(store.views(plans=plans, epoch=epoch), rng=rng) for _ in range(n)]


def test_it_takes_the_best_prior_deterministically_while_no_arm_is_proven(store):
    decisions = draw(store, n=200)

    assert {d.arm.plan.signature for d in decisions} == {FAST.signature}
    assert {d.mode for d in decisions} == {DecisionMode.GREEDY_FALLBACK}


def test_it_splits_traffic_in_proportion_to_speed_at_alpha_one(store):
    learn(store, FAST, 60.0)
    learn(store, SLOW, 40.0)

    counts = Counter(d.arm.plan.signature for d in draw(store, plans=[FAST, SLOW]))

    assert counts[FAST.signature] / 4000 == pytest.approx(0.6, abs=0.03)
    assert counts[SLOW.signature] / 4000 == pytest.approx(0.4, abs=0.03)


def test_it_shifts_traffic_toward_the_winner_as_alpha_grows(store):
    learn(store, FAST, 60.0)
    learn(store, SLOW, 40.0)
    config = RoutePolicyConfig(policy=POLICY_ADR0021, weight_alpha=2.0)

    counts = Counter(d.arm.plan.signature for d in draw(store, plans=[FAST, SLOW], config=config))

    assert counts[FAST.signature] / 4000 == pytest.approx(36 / 52, abs=0.03)


def test_it_scouts_at_the_explore_share(store):
    learn(store, FAST, 60.0)
    learn(store, SLOW, 40.0)

    decisions = draw(store)

    scouts = [d for d in decisions if d.mode is DecisionMode.SCOUT]
    assert len(scouts) / 4000 == pytest.approx(0.3, abs=0.03)
    assert {d.arm.plan.signature for d in scouts} == {THIRD.signature}


def test_it_never_scouts_at_an_explore_share_of_zero(store):
    learn(store, FAST, 60.0)

    decisions = draw(
        store, config=RoutePolicyConfig(policy=POLICY_ADR0021, explore_share=0.0), n=500
    )

    assert {d.mode for d in decisions} == {DecisionMode.EXPLOIT}


def test_it_scouts_the_least_measured_arm_first(store, clock):
    learn(store, FAST, 60.0, times=1)
    clock.advance(700.0)  # FAST decays to ~0.45: scoutable but measured
    learn(store, SLOW, 40.0)
    learn(store, THIRD, 10.0, epoch=0)  # stale: no weight under epoch 1

    scouts = {d.arm.plan.signature for d in draw(store, n=300) if d.mode is DecisionMode.SCOUT}

    assert scouts == {THIRD.signature}


def test_it_breaks_a_scouting_tie_on_the_prior(store):
    learn(store, THIRD, 60.0)

    scouts = {d.arm.plan.signature for d in draw(store, n=300) if d.mode is DecisionMode.SCOUT}

    assert scouts == {FAST.signature}


def test_it_exploits_every_time_when_nothing_is_left_to_scout(store):
    for plan in PLANS:
        learn(store, plan, 50.0)

    assert {d.mode for d in draw(store, n=500)} == {DecisionMode.EXPLOIT}


def test_it_never_chooses_a_quarantined_arm(store):
    learn(store, FAST, 600.0)
    learn(store, SLOW, 40.0)
    store.exclusions.quarantine_route(model_key="m", signature=FAST.signature, seconds=3600)

    chosen = {d.arm.plan.signature for d in draw(store, n=1000)}

    assert FAST.signature not in chosen


def test_it_falls_back_past_a_best_prior_through_a_banned_node(store):
    store.exclusions.ban_node(node_id="fast", seconds=3600)

    decisions = draw(store, n=50)

    assert {(d.arm.plan.signature, d.mode) for d in decisions} == {
        (SLOW.signature, DecisionMode.GREEDY_FALLBACK)
    }


def test_it_repeats_its_choices_for_the_same_seed(store):
    learn(store, FAST, 60.0)
    learn(store, SLOW, 40.0)

    first = [d.arm.plan.signature for d in draw(store, n=200, seed=11)]
    again = [d.arm.plan.signature for d in draw(store, n=200, seed=11)]

    assert first == again


def test_it_states_expected_shares_that_match_what_it_does(store):
    learn(store, FAST, 60.0)
    learn(store, SLOW, 40.0)

    shares = DEFAULT.route_policy().shares(store.views(plans=PLANS, epoch=1))
    counts = Counter(d.arm.plan.signature for d in draw(store))

    assert shares == pytest.approx([0.7 * 0.6, 0.7 * 0.4, 0.3])
    for plan, share in zip(PLANS, shares, strict=True):
        assert counts[plan.signature] / 4000 == pytest.approx(share, abs=0.03)


def test_it_expects_all_traffic_on_the_best_prior_before_any_sample(store):
    shares = DEFAULT.route_policy().shares(store.views(plans=PLANS, epoch=1))

    assert shares == [1.0, 0.0, 0.0]


def test_it_chooses_nothing_among_no_candidates(store):
    assert draw(store, plans=[], n=1) == [None]


def test_a_very_large_alpha_sends_all_exploit_traffic_to_the_fastest_route(store):
    learn(store, FAST, 600.0)
    learn(store, SLOW, 400.0)
    config = RoutePolicyConfig(policy=POLICY_ADR0021, explore_share=0.0, weight_alpha=400.0)

    shares = config.route_policy().shares(store.views(plans=[FAST, SLOW], epoch=1))
    decisions = draw(store, plans=[FAST, SLOW], config=config, n=50)

    assert shares == pytest.approx([1.0, 0.0])
    assert {d.arm.plan.signature for d in decisions} == {FAST.signature}
