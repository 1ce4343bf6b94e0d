"""choose_route under the adr0021 policy: greedy fallback, scouting, exploiting P ∝ tps^alpha,
quarantine, pinning."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from rest_framework import status

from meshnet_site.errors import http_error
from routing_app.choice import DecisionMode, NoRouteAvailable, choose_route, route_shares
from routing_app.config import POLICY_ADR0021, RoutingConfig
from routing_app.planner import enumerate_routes
from routing_app.services import route_sample_record, route_select
from tests.support.routing import learn, make_model, make_node, record

NODES = [
    record("fast", 0, 29, tps=300.0),
    record("slow", 0, 29, tps=200.0),
    record("third", 0, 29, tps=100.0),
]
PLANS = enumerate_routes(model_key="m", num_layers=30, nodes=NODES)
FAST, SLOW, THIRD = PLANS
DEFAULT = RoutingConfig(policy=POLICY_ADR0021)


def draw(store, *, plans=PLANS, config=DEFAULT, n=4000, seed=7, epoch=1):
    rng = random.Random(seed)
    return [
        choose_route(plans=plans, store=store, epoch=epoch, config=config, rng=rng)
        for _ in range(n)
    ]


def test_it_takes_the_best_prior_deterministically_while_no_arm_is_proven(store):
    decisions = draw(store, n=200)

    assert {d.plan.signature for d in decisions} == {FAST.signature}
    assert {d.mode for d in decisions} == {DecisionMode.GREEDY_FALLBACK}


def test_it_splits_traffic_in_proportion_to_speed_at_alpha_one(store):
    learn(store, FAST, 60.0)
    learn(store, SLOW, 40.0)

    counts = Counter(d.plan.signature for d in draw(store, plans=[FAST, SLOW]))

    assert counts[FAST.signature] / 4000 == pytest.approx(0.6, abs=0.03)
    assert counts[SLOW.signature] / 4000 == pytest.approx(0.4, abs=0.03)


def test_it_shifts_traffic_toward_the_winner_as_alpha_grows(store):
    learn(store, FAST, 60.0)
    learn(store, SLOW, 40.0)
    config = RoutingConfig(policy=POLICY_ADR0021, weight_alpha=2.0)

    counts = Counter(d.plan.signature for d in draw(store, plans=[FAST, SLOW], config=config))

    assert counts[FAST.signature] / 4000 == pytest.approx(36 / 52, abs=0.03)


def test_it_scouts_at_the_explore_share(store):
    learn(store, FAST, 60.0)
    learn(store, SLOW, 40.0)

    decisions = draw(store)

    scouts = [d for d in decisions if d.mode is DecisionMode.SCOUT]
    assert len(scouts) / 4000 == pytest.approx(0.3, abs=0.03)
    assert {d.plan.signature for d in scouts} == {THIRD.signature}


def test_it_never_scouts_at_an_explore_share_of_zero(store):
    learn(store, FAST, 60.0)

    decisions = draw(store, config=RoutingConfig(policy=POLICY_ADR0021, explore_share=0.0), n=500)

    assert {d.mode for d in decisions} == {DecisionMode.EXPLOIT}


def test_it_scouts_the_least_measured_arm_first(store, clock):
    learn(store, FAST, 60.0, times=1)
    clock.advance(700.0)  # FAST decays to ~0.45: scoutable but measured
    learn(store, SLOW, 40.0)
    learn(store, THIRD, 10.0, epoch=0)  # stale: no weight under epoch 1

    scouts = {d.plan.signature for d in draw(store, n=300) if d.mode is DecisionMode.SCOUT}

    assert scouts == {THIRD.signature}


def test_it_breaks_a_scouting_tie_on_the_prior(store):
    learn(store, THIRD, 60.0)

    scouts = {d.plan.signature for d in draw(store, n=300) if d.mode is DecisionMode.SCOUT}

    assert scouts == {FAST.signature}


def test_it_exploits_every_time_when_nothing_is_left_to_scout(store):
    for plan in PLANS:
        learn(store, plan, 50.0)

    assert {d.mode for d in draw(store, n=500)} == {DecisionMode.EXPLOIT}


def test_it_never_chooses_a_quarantined_arm(store):
    learn(store, FAST, 600.0)
    learn(store, SLOW, 40.0)
    store.quarantine_route(model_key="m", signature=FAST.signature, seconds=3600)

    chosen = {d.plan.signature for d in draw(store, n=1000)}

    assert FAST.signature not in chosen


def test_it_falls_back_past_a_quarantined_best_prior(store):
    store.quarantine_node(node_id="fast", seconds=3600)

    decisions = draw(store, n=50)

    assert {(d.plan.signature, d.mode) for d in decisions} == {
        (SLOW.signature, DecisionMode.GREEDY_FALLBACK)
    }


def test_it_answers_503_when_every_candidate_is_quarantined(store):
    for node in NODES:
        store.quarantine_node(node_id=node.node_id, seconds=3600)

    with pytest.raises(NoRouteAvailable) as caught:
        draw(store, n=1)

    assert http_error(caught.value).status == status.HTTP_503_SERVICE_UNAVAILABLE


def test_it_repeats_its_choices_for_the_same_seed(store):
    learn(store, FAST, 60.0)
    learn(store, SLOW, 40.0)

    first = [d.plan.signature for d in draw(store, n=200, seed=11)]
    again = [d.plan.signature for d in draw(store, n=200, seed=11)]

    assert first == again


def test_it_states_expected_shares_that_match_what_it_does(store):
    learn(store, FAST, 60.0)
    learn(store, SLOW, 40.0)

    shares = route_shares(arms=store.views(plans=PLANS, epoch=1), config=DEFAULT)
    counts = Counter(d.plan.signature for d in draw(store))

    assert shares == pytest.approx([0.7 * 0.6, 0.7 * 0.4, 0.3])
    for plan, share in zip(PLANS, shares, strict=True):
        assert counts[plan.signature] / 4000 == pytest.approx(share, abs=0.03)


def test_it_expects_all_traffic_on_the_best_prior_before_any_sample(store):
    shares = route_shares(arms=store.views(plans=PLANS, epoch=1), config=DEFAULT)

    assert shares == [1.0, 0.0, 0.0]


def test_it_returns_the_decision_with_its_plan_mode_and_epoch(store):
    learn(store, FAST, 60.0, epoch=4)

    (decision,) = draw(
        store, n=1, epoch=4, config=RoutingConfig(policy=POLICY_ADR0021, explore_share=0.0)
    )

    assert decision.epoch == 4
    assert decision.to_dict() == {
        "route": "m | fast[0-29]",
        "mode": "exploit",
        "hops": [
            {
                "node_id": "fast",
                "endpoint": "http://fast.test:7000",
                "start_layer": 0,
                "end_layer": 29,
            }
        ],
    }


@pytest.mark.django_db
def test_it_prefers_the_single_full_node_over_the_hybrid_route_at_cold_start(store):
    model = make_model(num_layers=40)
    make_node(model, "gpu-abc", 0, 21, tps=11164.0)
    make_node(model, "cpu-def", 0, 39, tps=425.0)

    decision = route_select(model=model, rng=random.Random(3))

    assert decision.mode is DecisionMode.GREEDY_FALLBACK
    assert decision.plan.signature == f"{model.key} | cpu-def[0-39]"


@pytest.mark.django_db
def test_it_learns_from_a_pinned_route_like_from_any_other(store):
    model = make_model(num_layers=40)
    make_node(model, "gpu-abc", 0, 21, tps=11164.0)
    make_node(model, "cpu-def", 0, 39, tps=425.0)
    pinned = route_select(model=model, pinned=["gpu-abc", "cpu-def"], rng=random.Random(3))

    assert route_sample_record(decision=pinned, output_tokens=100, elapsed_seconds=2.0)

    decision = route_select(model=model, rng=random.Random(3))
    assert decision.mode in (DecisionMode.EXPLOIT, DecisionMode.SCOUT)
    assert store.arm(model_key=model.key, signature=pinned.plan.signature).value == 50.0


@pytest.mark.django_db
def test_it_answers_503_naming_the_layers_no_online_node_serves(store):
    model = make_model(num_layers=30)
    make_node(model, "head", 0, 9)
    make_node(model, "middle", 12, 20)

    with pytest.raises(NoRouteAvailable) as caught:
        route_select(model=model, rng=random.Random(3))

    assert http_error(caught.value).status == status.HTTP_503_SERVICE_UNAVAILABLE
    assert "no online node serves layers 10-11, 21-29 (of 0-29)" in caught.value.message


def test_it_refuses_to_choose_among_no_candidates(store):
    with pytest.raises(ValueError, match="at least one candidate"):
        draw(store, plans=[], n=1)


def test_a_very_large_alpha_sends_all_exploit_traffic_to_the_fastest_route(store):
    learn(store, FAST, 600.0)
    learn(store, SLOW, 400.0)
    config = RoutingConfig(policy=POLICY_ADR0021, explore_share=0.0, weight_alpha=400.0)

    shares = route_shares(arms=store.views(plans=[FAST, SLOW], epoch=1), config=config)
    decisions = draw(store, plans=[FAST, SLOW], config=config, n=50)

    assert shares == pytest.approx([1.0, 0.0])
    assert {d.plan.signature for d in decisions} == {FAST.signature}
