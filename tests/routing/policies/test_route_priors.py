"""Route priors from the nodes on a route (ADR-0018): N heads x M tails are not N x M
cold starts, and a route's own samples stay the truth."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from routing_app.learning.arms import ArmStatus, ArmView
from routing_app.planning.route_plan import RoutePlan
from routing_app.planning.search import enumerate_routes
from routing_app.policies.config import RoutePolicyConfig
from routing_app.policies.load import NO_LOAD, LoadSnapshot
from routing_app.policies.priors import KNOWN_SIGMA, UNKNOWN_SIGMA, cold_pick, route_priors
from routing_app.policies.thompson import DUE_SHARE
from routing_app.services import route_session_close
from tests.support.routing import choose_counted, learn, record

CONFIG = RoutePolicyConfig()  # thompson-load
NODES = [
    record("head-a", 0, 1, tps=100.0),
    record("head-b", 0, 1, tps=100.0),
    record("tail-a", 2, 3, tps=100.0),
    record("tail-b", 2, 3, tps=100.0),
]
PLANS = {plan.node_ids: plan for plan in enumerate_routes(model_key="m", num_layers=4, nodes=NODES)}


def plan(head: str, tail: str) -> RoutePlan:
    return PLANS[(f"head-{head}", f"tail-{tail}")]


def measured(route: RoutePlan, tps: float) -> ArmView:
    return ArmView(route, ArmStatus.PROVEN, tps, 5.0, 5, 1.0)


def unsampled(route: RoutePlan) -> ArmView:
    return ArmView(route, ArmStatus.UNSAMPLED, None, 0.0, 0, 0.0)


def test_a_route_through_a_node_measured_slow_is_predicted_slow():
    arms = [
        measured(plan("a", "a"), 100.0),
        measured(plan("a", "b"), 20.0),  # tail-b is the slow one
        unsampled(plan("b", "a")),
        unsampled(plan("b", "b")),
    ]

    priors = route_priors(arms)

    through_a, through_b = priors[2], priors[3]
    assert through_a is not None and through_b is not None
    assert math.exp(through_a[0]) > 2 * math.exp(through_b[0])
    assert math.exp(through_b[0]) < 40.0


def test_a_prediction_from_measured_nodes_is_narrower_than_one_from_records_alone():
    arms = [
        measured(plan("a", "a"), 100.0),
        unsampled(plan("b", "a")),  # head-b was never measured, tail-a was
        unsampled(plan("b", "b")),  # neither node was
        unsampled(plan("a", "b")),  # head-a was, tail-b not
    ]

    priors = route_priors(arms)

    half_known, unknown, other_half = priors[1], priors[2], priors[3]
    assert half_known is not None and unknown is not None and other_half is not None
    assert KNOWN_SIGMA < half_known[1] < unknown[1] == UNKNOWN_SIGMA
    assert half_known[1] == other_half[1]


def test_measured_routes_keep_their_own_belief_and_stale_ones_their_old_speed():
    arms = [
        measured(plan("a", "a"), 100.0),
        ArmView(plan("a", "b"), ArmStatus.STALE, 40.0, 5.0, 5, 30.0),
    ]

    priors = route_priors(arms)

    assert priors[0] is None
    assert priors[1] == (math.log(40.0), KNOWN_SIGMA)


def test_one_measured_route_is_enough_to_draw_among_all_four_without_scouting_each():
    arms = [measured(plan("a", "a"), 100.0)] + [
        unsampled(route) for route in PLANS.values() if route is not plan("a", "a")
    ]
    rng = random.Random(7)

    picks = [CONFIG.route_policy().choose(arms, rng=rng) for _ in range(400)]

    modes = Counter(pick[1] for pick in picks if pick)
    chosen = Counter(pick[0].plan.signature for pick in picks if pick)
    assert len(chosen) == 4  # nodes alike: every route takes a fair part of the traffic
    assert all(40 <= count <= 200 for count in chosen.values())
    assert set(modes) == {"exploit", "scout"}  # a pick of an unmeasured route measures it


def test_a_burst_at_a_cold_start_spreads_over_the_candidates():
    arms = [unsampled(route) for route in PLANS.values()]
    first = CONFIG.route_policy().choose(arms, rng=random.Random(1))
    burst = LoadSnapshot(routes={first[0].plan.signature: 6} if first else {})

    picks = [
        CONFIG.route_policy().choose(arms, rng=random.Random(i), loads=burst) for i in range(50)
    ]

    assert first is not None and first[1] == "greedy-fallback"
    assert {pick[0].plan.signature for pick in picks if pick} - {first[0].plan.signature}


def test_an_unsampled_route_predicted_slow_is_still_measured_within_the_bound(
    store, clock, load_book
):
    nodes = [record("fast", 0, 3, tps=100.0), record("slow", 0, 3, tps=2.0)]
    fast, slow = enumerate_routes(model_key="m", num_layers=4, nodes=nodes)
    learn(store, fast, 100.0, times=9)
    rng = random.Random(3)

    def choose():
        decision = choose_counted(
            plans=[fast, slow], store=store, policy=CONFIG.route_policy(), rng=rng, load=load_book
        )
        route_session_close(decision=decision, load=load_book)
        return decision

    early = [choose() for _ in range(20)]
    clock.advance(CONFIG.max_unsampled_seconds * DUE_SHARE + 1.0)
    learn(store, fast, 100.0, times=1)
    due = choose()

    assert [decision.plan for decision in early] == [fast] * 20
    assert (due.plan, due.mode) == (slow, "scout")


def test_the_unsampled_routes_draw_follows_the_shares_the_table_states():
    arms = [measured(plan("a", "a"), 100.0)] + [
        unsampled(route) for route in PLANS.values() if route is not plan("a", "a")
    ]
    policy = CONFIG.route_policy()
    shares = policy.shares(arms, loads=NO_LOAD, include_scout=False)
    rng = random.Random(11)

    picks = Counter(policy.choose(arms, rng=rng)[0].plan.signature for _ in range(4000))  # type: ignore[index]

    for arm, share in zip(arms, shares, strict=True):
        assert picks[arm.plan.signature] / 4000 == pytest.approx(share, abs=0.03)


LIAR_NODES = [*NODES, record("head-liar", 0, 1, tps=1e6)]
LIAR_PLANS = {
    p.node_ids: p for p in enumerate_routes(model_key="m", num_layers=4, nodes=LIAR_NODES)
}


def test_a_claimed_speed_is_never_predicted_faster_than_the_best_measured_route():
    arms = [
        measured(LIAR_PLANS[("head-a", "tail-a")], 50.0),
        unsampled(LIAR_PLANS[("head-liar", "tail-a")]),
        unsampled(LIAR_PLANS[("head-liar", "tail-b")]),
    ]

    priors = route_priors(arms)

    for prior in priors[1:]:
        assert prior is not None
        assert math.exp(prior[0]) <= 50.0 * (1 + 1e-9)


def test_a_cold_start_takes_a_stale_measured_route_over_a_bigger_claim():
    liar = unsampled(LIAR_PLANS[("head-liar", "tail-a")])
    stale = ArmView(LIAR_PLANS[("head-a", "tail-a")], ArmStatus.STALE, 50.0, 5.0, 5, 30.0)

    assert cold_pick([liar, stale]) == 1
    # With nothing measured, the claims are all there is: the planner's first.
    assert cold_pick([liar, unsampled(LIAR_PLANS[("head-a", "tail-a")])]) == 0
