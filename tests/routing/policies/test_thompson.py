"""The thompson-load policy (ADR-0011): ADR-0021's guarantees, uncertainty-driven choice,
load shedding and the bound on unsampled time."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing_app.learning.arms import ArmStatus, ArmView
from routing_app.planning.search import enumerate_routes
from routing_app.policies.config import RoutePolicyConfig
from routing_app.policies.load import NO_LOAD, LoadSnapshot, Pace, RouteLoad
from routing_app.policies.priors import cold_pick
from routing_app.policies.thompson import DUE_SHARE
from routing_app.services import route_sample_record, route_session_close
from tests.support.routing import choose_counted, learn, record

NODES = [record(f"n{i}", 0, 29, tps=100.0 - i) for i in range(6)]
PLANS = enumerate_routes(model_key="m", num_layers=30, nodes=NODES)
CONFIG = RoutePolicyConfig()  # the default: thompson-load


def arm(index: int, status: ArmStatus, tps: float | None = 50.0, **extra: float) -> ArmView:
    weight = extra.get("weight", 0.0 if status in (ArmStatus.UNSAMPLED,) else 5.0)
    age = extra.get("age", None if status is ArmStatus.UNSAMPLED else 1.0)
    samples = 0 if status is ArmStatus.UNSAMPLED else 5
    return ArmView(
        PLANS[index],
        status,
        None if status is ArmStatus.UNSAMPLED else tps,
        weight,
        samples,
        age,
    )


def busy(*indices: int, sessions: int = 1) -> LoadSnapshot:
    return LoadSnapshot(routes={PLANS[i].signature: sessions for i in indices})


def picks(arms, *, loads=NO_LOAD, config=CONFIG, n=2000, seed=3):
    rng = random.Random(seed)
    return [config.route_policy().choose(arms, loads=loads, rng=rng) for _ in range(n)]


@st.composite
def arm_sets(draw: st.DrawFn) -> tuple[list[ArmView], LoadSnapshot]:
    """Up to six candidates in any state, best prior first, with any load."""
    count = draw(st.integers(min_value=1, max_value=6))
    arms, routes, sent_ago, paces = [], {}, {}, {}
    for index in range(count):
        status = draw(st.sampled_from(list(ArmStatus)))
        arms.append(
            arm(
                index,
                status,
                tps=draw(st.floats(min_value=0.1, max_value=1000.0)),
                weight=draw(st.floats(min_value=0.0, max_value=50.0)),
                age=draw(st.floats(min_value=0.0, max_value=5000.0)),
            )
        )
        routes[PLANS[index].signature] = draw(st.integers(min_value=0, max_value=20))
        sent = draw(st.none() | st.floats(min_value=0.0, max_value=5000.0))
        if sent is not None:
            sent_ago[PLANS[index].signature] = sent
        paces[PLANS[index].signature] = [
            Pace(tokens, prefill + streaming, streaming)
            for tokens, prefill, streaming in draw(
                st.lists(
                    st.tuples(
                        st.integers(min_value=0, max_value=5000),
                        st.floats(min_value=0.0, max_value=100.0),
                        st.floats(min_value=0.0, max_value=5000.0),
                    ),
                    max_size=routes[PLANS[index].signature],
                )
            )
        ]
    return arms, LoadSnapshot(routes=routes, sent_ago=sent_ago, paces=paces)


@settings(max_examples=300, deadline=None)
@given(arm_sets(), st.integers(min_value=0, max_value=2**32))
def test_it_never_chooses_a_quarantined_route_and_answers_none_only_when_all_are(case, seed):
    arms, loads = case
    picked = CONFIG.route_policy().choose(arms, loads=loads, rng=random.Random(seed))

    if all(a.status is ArmStatus.QUARANTINED for a in arms):
        assert picked is None
    else:
        assert picked is not None
        assert picked[0].status is not ArmStatus.QUARANTINED


@settings(max_examples=300, deadline=None)
@given(arm_sets(), st.integers(min_value=0, max_value=2**32))
def test_with_no_proven_route_and_none_in_flight_it_takes_the_best_prior_whatever_the_draw(
    case, seed
):
    arms, loads = case
    arms = [a for a in arms if a.status is not ArmStatus.PROVEN]
    eligible = [a for a in arms if a.status is not ArmStatus.QUARANTINED]
    picked = CONFIG.route_policy().choose(arms, loads=loads, rng=random.Random(seed))

    if eligible and not any(loads.route_sessions(a.plan) for a in eligible):
        # The best prior: the planner's first while nothing is timed, else no claim
        # above a measurement (priors.cold_pick).
        assert picked == (eligible[cold_pick(eligible)], "greedy-fallback")
    elif eligible:
        assert picked is not None and picked[0] in eligible


@settings(max_examples=300, deadline=None)
@given(arm_sets(), st.integers(min_value=0, max_value=2**32))
def test_it_exploits_only_routes_measured_under_the_current_topology(case, seed):
    arms, loads = case
    picked = CONFIG.route_policy().choose(arms, loads=loads, rng=random.Random(seed))

    if picked is not None and picked[1] == "exploit":
        assert picked[0].status in (ArmStatus.PROVEN, ArmStatus.DECAYED)


@settings(max_examples=300, deadline=None)
@given(arm_sets(), st.integers(min_value=0, max_value=2**32))
def test_it_measures_an_idle_overdue_route_measured_or_not_before_any_draw(case, seed):
    arms, loads = case
    picked = CONFIG.route_policy().choose(arms, loads=loads, rng=random.Random(seed))
    eligible = [a for a in arms if a.status is not ArmStatus.QUARANTINED]
    due = [
        a
        for a in eligible
        if loads.route_sessions(a.plan) == 0
        and min(a.last_sample_age or 0.0, loads.sent_ago.get(a.plan.signature, math.inf))
        > CONFIG.max_unsampled_seconds * DUE_SHARE
    ]

    if picked is not None and any(a.status is ArmStatus.PROVEN for a in eligible) and due:
        assert picked[1] == "scout"
        assert picked[0] in due


@settings(max_examples=200, deadline=None)
@given(arm_sets())
def test_its_expected_shares_are_a_distribution_over_the_routes_it_may_choose(case):
    arms, loads = case
    shares = CONFIG.route_policy().shares(arms, loads=loads)

    assert all(math.isfinite(share) and share >= 0.0 for share in shares)
    for view, share in zip(arms, shares, strict=True):
        if view.status is ArmStatus.QUARANTINED:
            assert share == 0.0
    if all(a.status is ArmStatus.QUARANTINED for a in arms):
        assert sum(shares) == 0.0
    else:
        assert sum(shares) == pytest.approx(1.0)


@settings(max_examples=100, deadline=None)
@given(
    st.floats(min_value=1.0, max_value=500.0),
    st.floats(min_value=1.0, max_value=500.0),
    st.integers(min_value=0, max_value=30),
)
def test_a_route_never_gains_share_as_its_sessions_in_flight_grow(fast, slow, sessions):
    arms = [arm(0, ArmStatus.PROVEN, fast), arm(1, ArmStatus.PROVEN, slow)]

    before = CONFIG.route_policy().shares(arms, loads=busy(0, sessions=sessions))
    after = CONFIG.route_policy().shares(arms, loads=busy(0, sessions=sessions + 1))

    assert after[0] <= before[0] + 1e-9


def test_it_sends_nearly_everything_to_a_clearly_faster_route():
    arms = [arm(0, ArmStatus.PROVEN, 60.0, weight=20.0), arm(1, ArmStatus.PROVEN, 30.0)]

    counts = Counter(picked[0].plan.signature for picked in picks(arms) if picked)

    assert counts[PLANS[0].signature] / 2000 >= 0.97


def test_it_splits_between_routes_it_cannot_tell_apart():
    arms = [arm(0, ArmStatus.PROVEN, 50.0), arm(1, ArmStatus.PROVEN, 50.0)]

    counts = Counter(picked[0].plan.signature for picked in picks(arms) if picked)

    assert counts[PLANS[0].signature] / 2000 == pytest.approx(0.5, abs=0.05)


def test_the_closer_requests_keep_to_their_routes_speed_the_more_the_faster_route_takes():
    def faster_share(spread: float) -> float:
        arms = [
            replace(arm(0, ArmStatus.PROVEN, 50.0, weight=20.0), sample_spread=spread),
            replace(arm(1, ArmStatus.PROVEN, 45.0, weight=20.0), sample_spread=spread),
        ]
        return CONFIG.route_policy().shares(arms, loads=NO_LOAD)[0]

    # Routes 10 % apart: at the default spread the slower one keeps a quarter of the
    # traffic; where the tracker learned that requests vary by 10 %, a few percent.
    assert 0.65 < faster_share(0.3) < 0.85
    assert faster_share(0.1) > 0.95


def test_it_retries_a_route_whose_evidence_has_decayed_more_than_a_well_known_one():
    fresh = [arm(0, ArmStatus.PROVEN, 60.0, weight=20.0), arm(1, ArmStatus.PROVEN, 45.0)]
    quiet = [
        arm(0, ArmStatus.PROVEN, 60.0, weight=20.0),
        arm(1, ArmStatus.DECAYED, 45.0, weight=0.2),
    ]

    fresh_share = CONFIG.route_policy().shares(fresh, loads=NO_LOAD)[1]
    quiet_share = CONFIG.route_policy().shares(quiet, loads=NO_LOAD)[1]

    assert quiet_share > 2 * fresh_share


def test_a_saturated_fast_route_sheds_traffic_to_the_next_one():
    arms = [arm(0, ArmStatus.PROVEN, 60.0, weight=20.0), arm(1, ArmStatus.PROVEN, 45.0)]

    idle = CONFIG.route_policy().shares(arms, loads=NO_LOAD)
    saturated = CONFIG.route_policy().shares(arms, loads=busy(0, sessions=8))

    assert idle[0] > 0.8
    assert saturated[1] > 0.8


# Two heads and two tails: four two-hop routes, h0 -> t0 the fastest.
STAGES = enumerate_routes(
    model_key="m",
    num_layers=30,
    nodes=[
        record("h0", 0, 14, tps=120.0),
        record("h1", 0, 14, tps=100.0),
        record("t0", 15, 29, tps=120.0),
        record("t1", 15, 29, tps=100.0),
    ],
)


def stage_arm(route: str, tps: float) -> ArmView:
    plan = next(plan for plan in STAGES if "".join(plan.node_ids) == route)
    return ArmView(plan, ArmStatus.PROVEN, tps, 20.0, 20, 1.0)


def test_sessions_on_another_route_through_the_same_node_shed_traffic_from_it():
    arms = [stage_arm("h0t0", 60.0), stage_arm("h1t0", 50.0), stage_arm("h0t1", 40.0)]
    on_h0 = arms[2].plan

    idle = CONFIG.route_policy().shares(arms, loads=NO_LOAD)
    shared = CONFIG.route_policy().shares(arms, loads=LoadSnapshot(routes={on_h0.signature: 8}))

    assert idle[0] > 0.8
    assert shared[1] > 0.8


def test_one_session_on_a_two_stage_route_leaves_the_next_request_on_it():
    """A session's one token is at one stage at a time: the stages work at once."""
    arms = [stage_arm("h0t0", 60.0), stage_arm("h1t1", 54.0)]
    plan = arms[0].plan

    shares = CONFIG.route_policy().shares(arms, loads=LoadSnapshot(routes={plan.signature: 1}))

    assert shares[0] > 0.7


def test_its_draws_follow_the_expected_shares_it_states():
    arms = [
        arm(0, ArmStatus.PROVEN, 50.0),
        arm(1, ArmStatus.PROVEN, 45.0),
        arm(2, ArmStatus.DECAYED, 40.0, weight=0.3),
    ]
    loads = busy(0, sessions=2)

    shares = CONFIG.route_policy().shares(arms, loads=loads)
    counts = Counter(p[0].plan.signature for p in picks(arms, loads=loads, n=6000) if p)

    for index, share in enumerate(shares):
        assert counts[PLANS[index].signature] / 6000 == pytest.approx(share, abs=0.03)


def test_it_scouts_a_route_past_the_bound_once_then_waits_for_its_sample():
    past_bound = CONFIG.max_unsampled_seconds + 1.0
    arms = [arm(0, ArmStatus.PROVEN, 60.0), arm(1, ArmStatus.PROVEN, 20.0, age=past_bound)]

    first = CONFIG.route_policy().choose(arms, loads=NO_LOAD, rng=random.Random(1))
    while_in_flight = picks(arms, loads=busy(1), n=200)

    assert first is not None and (first[0].plan, first[1]) == (PLANS[1], "scout")
    assert {p[1] for p in while_in_flight if p} == {"exploit"}


def test_routes_that_fall_due_together_are_each_scouted_before_the_bound():
    """Routes measured together (after a topology change) fall due together; one request
    scouts one of them, so they fall due early enough for the next requests to take the rest."""
    due = CONFIG.max_unsampled_seconds * DUE_SHARE
    arms = [
        arm(0, ArmStatus.PROVEN, 60.0),
        arm(1, ArmStatus.PROVEN, 20.0, age=due + 1.0),
        arm(2, ArmStatus.PROVEN, 30.0, age=due + 2.0),
    ]

    first = CONFIG.route_policy().choose(arms, loads=NO_LOAD, rng=random.Random(1))
    second = CONFIG.route_policy().choose(arms, loads=busy(2), rng=random.Random(1))

    assert first is not None and (first[0].plan, first[1]) == (PLANS[2], "scout")
    assert second is not None and (second[0].plan, second[1]) == (PLANS[1], "scout")
    assert due + 2.0 < CONFIG.max_unsampled_seconds


def test_a_route_quiet_since_before_a_topology_change_is_scouted_first_the_others_drawn():
    """After a topology change every route is unmeasured; one that was already near the
    bound is scouted at once, the others take part in the draw with their old speeds."""
    due = CONFIG.max_unsampled_seconds * DUE_SHARE
    arms = [
        arm(0, ArmStatus.PROVEN, 60.0),
        arm(1, ArmStatus.STALE, 50.0, age=10.0),
        arm(2, ArmStatus.STALE, 20.0, age=due + 5.0),
    ]

    picked = CONFIG.route_policy().choose(arms, loads=NO_LOAD, rng=random.Random(1))
    then = CONFIG.route_policy().choose(arms, loads=busy(2), rng=random.Random(1))

    assert picked is not None and (picked[0].plan, picked[1]) == (PLANS[2], "scout")
    assert then is not None and then[0].plan in (PLANS[0], PLANS[1], PLANS[2])


def paced(*routes: list[tuple[int, float]], prefill: float = 0.0) -> LoadSnapshot:
    """Requests in flight on routes 0, 1, ...: (tokens so far, seconds since the first
    token) each, sent ``prefill`` seconds before that first token."""
    return LoadSnapshot(
        routes={PLANS[i].signature: len(streams) for i, streams in enumerate(routes)},
        paces={
            PLANS[i].signature: [Pace(t, prefill + seconds, seconds) for t, seconds in streams]
            for i, streams in enumerate(routes)
        },
    )


def test_a_route_whose_streams_crawl_loses_its_traffic_before_any_of_them_completes():
    """The best route slows 5x: its samples arrive only as its (now slow) requests complete,
    but the streams in flight show the pace at once."""
    arms = [arm(0, ArmStatus.PROVEN, 60.0, weight=9.0), arm(1, ArmStatus.PROVEN, 45.0)]
    on_pace = paced([(120, 2.0)] * 3, [(90, 2.0)] * 3)
    crawling = paced([(24, 2.0)] * 3, [(90, 2.0)] * 3)  # route 0 at 12 tok/s

    assert CONFIG.route_policy().shares(arms, loads=on_pace)[0] > 0.9
    assert CONFIG.route_policy().shares(arms, loads=crawling)[0] < 0.2


def test_streams_that_stalled_count_against_their_route():
    arms = [arm(0, ArmStatus.PROVEN, 60.0, weight=9.0), arm(1, ArmStatus.PROVEN, 45.0)]

    stalled = CONFIG.route_policy().shares(arms, loads=paced([(0, 1.0)] * 3, [(45, 1.0)] * 3))

    assert stalled[0] < 0.2


def test_a_stream_is_not_judged_before_it_has_had_time_for_two_samples_worth():
    """A stream's first tokens, or a backlog of its frames read at once, say nothing yet:
    the route keeps the share its load alone gives it (16 tokens at 60 tok/s: 0.27 s)."""
    arms = [arm(0, ArmStatus.PROVEN, 60.0, weight=9.0), arm(1, ArmStatus.PROVEN, 45.0)]
    unpaced = CONFIG.route_policy().shares(arms, loads=busy(0))

    starting = CONFIG.route_policy().shares(arms, loads=paced([(1, 0.2)]))
    backlog = CONFIG.route_policy().shares(arms, loads=paced([(30, 0.05)]))
    prefilled = CONFIG.route_policy().shares(arms, loads=paced([(1, 0.2)], prefill=3.0))
    judged = CONFIG.route_policy().shares(arms, loads=paced([(1, 0.3)]))

    assert starting == pytest.approx(unpaced)
    assert backlog == pytest.approx(unpaced)
    assert prefilled == pytest.approx(unpaced)
    assert judged[0] < unpaced[0] - 0.05


def test_a_judged_request_counts_as_the_sample_it_would_give_if_it_ended_now():
    """Its prefill included, as the proxy's sample includes it: 60 tokens 2 s after a
    2 s prefill are 15 tok/s, not 30."""
    arms = [arm(0, ArmStatus.PROVEN, 30.0, weight=9.0), arm(1, ArmStatus.PROVEN, 25.0)]
    others = [Pace(50, 2.0, 2.0)] * 3  # route 1 as loaded, at its 25 tok/s

    def shares(prefill: float) -> list[float]:
        ours = [Pace(60, prefill + 2.0, 2.0)] * 3
        loads = LoadSnapshot(
            routes={PLANS[0].signature: 3, PLANS[1].signature: 3},
            paces={PLANS[0].signature: ours, PLANS[1].signature: others},
        )
        return CONFIG.route_policy().shares(arms, loads=loads)

    assert shares(prefill=0.0)[0] > 0.5 > shares(prefill=2.0)[0]


def test_a_request_early_in_its_stream_counts_as_the_sample_it_will_give_at_its_length():
    """A busy route's requests wait for their first token: 20 tokens 0.63 s after a 2 s
    wait are 7.6 tok/s if they ended now, but carried on at 30 tok/s to the 256 tokens
    asked for they are 24.5 tok/s, as their samples will be. Read as if ended now, the
    fastest route looks slowest while it is busiest and loses the traffic it should keep."""
    arms = [arm(0, ArmStatus.PROVEN, 30.0, weight=9.0), arm(1, ArmStatus.PROVEN, 25.0)]
    others = [Pace(50, 2.0, 2.0)] * 3  # route 1 as loaded, at its 25 tok/s

    def shares(planned: int) -> list[float]:
        ours = [Pace(20, 2.0 + 19 / 30, 19 / 30, planned)] * 3
        loads = LoadSnapshot(
            routes={PLANS[0].signature: 3, PLANS[1].signature: 3},
            paces={PLANS[0].signature: ours, PLANS[1].signature: others},
        )
        return CONFIG.route_policy().shares(arms, loads=loads)

    assert shares(planned=0)[0] < 0.3 < 0.5 < shares(planned=256)[0]


def test_the_bound_is_a_setting():
    arms = [arm(0, ArmStatus.PROVEN, 60.0), arm(1, ArmStatus.PROVEN, 20.0, age=100.0)]
    strict = RoutePolicyConfig(max_unsampled_seconds=60.0)

    picked = strict.route_policy().choose(arms, loads=NO_LOAD, rng=random.Random(1))

    assert picked is not None and picked[0].plan == PLANS[1]


def test_the_table_states_the_active_policys_shares(store):
    learn(store, PLANS[0], 60.0, times=5)
    learn(store, PLANS[1], 30.0, times=5)
    arms = store.views(plans=PLANS[:2], epoch=1)

    adr = RoutePolicyConfig(policy="adr0021").route_policy().shares(arms)
    ours = CONFIG.route_policy().shares(arms)

    assert adr == pytest.approx([2 / 3, 1 / 3])
    assert ours[0] > 0.95


def test_a_route_whose_scout_came_back_too_short_to_count_is_not_scouted_again_at_once(
    store, clock
):
    model_plans = PLANS[:2]
    for plan, tps in zip(model_plans, (60.0, 20.0), strict=True):
        learn(store, plan, tps)
    clock.advance(CONFIG.max_unsampled_seconds + 1.0)
    learn(store, PLANS[0], 60.0, times=1)
    load, rng = RouteLoad(), random.Random(2)

    def choose():
        return choose_counted(
            plans=model_plans, store=store, policy=CONFIG.route_policy(), rng=rng, load=load
        )

    scout = choose()
    route_sample_record(decision=scout, output_tokens=2, elapsed_seconds=1.0, load=load)
    after = [choose() for _ in range(50)]
    for decision in after:
        route_session_close(decision=decision, load=load)

    assert (scout.plan, scout.mode) == (PLANS[1], "scout")
    assert [d for d in after if d.mode == "scout"] == []


def test_a_slow_route_whose_evidence_has_decayed_away_is_retried_to_see_if_it_recovered():
    arms = [
        arm(0, ArmStatus.PROVEN, 60.0, weight=20.0),
        arm(1, ArmStatus.DECAYED, 20.0, weight=0.01),  # 3x slower, last seen hours ago
    ]

    share = CONFIG.route_policy().shares(arms, loads=NO_LOAD)[1]

    assert share > 0.05
