"""The load book (ADR-0011, "Where the load comes from"): sessions in flight per route,
opened in one step with the choice, closed however a request ends."""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Iterator
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing_app.planning.search import enumerate_routes
from routing_app.policies.choice import DecisionMode, RouteDecision
from routing_app.policies.config import RoutePolicyConfig
from routing_app.policies.load import Pace, RouteLoad
from routing_app.services import route_session_close, route_session_open, route_session_touch
from tests.support.routing import ManualClock, choose_counted, learn, record

NODES = [record("fast", 0, 29, tps=100.0), record("new", 0, 29, tps=90.0)]
PLANS = enumerate_routes(model_key="m", num_layers=30, nodes=NODES)
CONFIG = RoutePolicyConfig()  # thompson-load


def decision(index: int = 0) -> RouteDecision:
    return RouteDecision(plan=PLANS[index], mode=DecisionMode.EXPLOIT, epoch=1)


@pytest.fixture
def busy_interpreter() -> Iterator[None]:
    """Switch threads as often as the interpreter can, so races show."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def choose_at_once(store, rng, load, *, requests):
    """``requests`` route choices started together on as many threads."""
    barrier = threading.Barrier(requests)
    decisions: list[RouteDecision] = []

    def request() -> None:
        barrier.wait()
        decisions.append(
            choose_counted(
                plans=PLANS, store=store, policy=CONFIG.route_policy(), rng=rng, load=load
            )
        )

    threads = [threading.Thread(target=request) for _ in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return decisions


def test_requests_chosen_at_once_send_one_scout_to_a_route_that_fell_due(
    store, clock, busy_interpreter
):
    learn(store, PLANS[1], 10.0, times=5)
    clock.advance(CONFIG.max_unsampled_seconds)
    learn(store, PLANS[0], 50.0, times=5)
    rng = random.Random(5)  # shared by every thread, like the tracker's
    for _ in range(20):
        load = RouteLoad()
        decisions = choose_at_once(store, rng, load, requests=8)

        scouts = [d.plan for d in decisions if d.mode is DecisionMode.SCOUT]
        assert scouts == [PLANS[1]]
        assert sum(load.snapshot().routes.values()) == 8


def test_a_session_nobody_closed_stops_counting_as_load_after_its_ttl():
    clock = ManualClock()
    load = RouteLoad(clock=clock)
    load.open(decision())

    clock.advance(901.0)

    assert load.snapshot().route_sessions(PLANS[0]) == 0


def test_a_request_sent_again_after_waiting_for_a_slot_counts_as_load_again():
    load = RouteLoad()
    chosen = decision()
    load.open(chosen)  # route_choose
    route_session_close(decision=chosen, load=load)  # the busy segment ended

    route_session_open(decision=chosen, load=load)  # the retry streams on the same decision
    route_session_open(decision=chosen, load=load)
    streaming = load.snapshot().route_sessions(PLANS[0])
    route_session_close(decision=chosen, load=load)

    assert (streaming, load.snapshot().route_sessions(PLANS[0])) == (1, 0)


def test_a_long_generation_that_makes_progress_keeps_counting_past_the_ttl():
    clock = ManualClock()
    load = RouteLoad(clock=clock)
    chosen = decision()
    load.open(chosen)

    for _ in range(4):  # 1600 s of a slow generation, tokens arriving
        clock.advance(400.0)
        route_session_touch(decision=chosen, load=load)

    assert load.snapshot().route_sessions(PLANS[0]) == 1


def test_a_request_has_a_pace_once_its_first_token_came_and_it_runs_from_the_send():
    clock = ManualClock()
    load = RouteLoad(clock=clock)
    chosen, stream = decision(), object()
    load.open(chosen)  # chosen, not streaming yet: load without a pace
    waiting = load.snapshot()
    route_session_open(decision=chosen, stream=stream, load=load)
    clock.advance(1.0)  # its prefill: no token yet, no pace
    prefilling = load.snapshot()
    route_session_touch(decision=chosen, stream=stream, tokens=2, load=load)
    clock.advance(2.0)
    route_session_open(decision=chosen, stream=stream, load=load)  # opened twice: kept
    route_session_touch(decision=chosen, stream=stream, tokens=30, load=load)
    streaming = load.snapshot()
    route_session_close(decision=chosen, stream=stream, load=load)  # busy: sent again
    route_session_open(decision=chosen, stream=stream, load=load)
    clock.advance(1.0)
    resent = load.snapshot()
    route_session_touch(decision=chosen, stream=stream, tokens=4, load=load)
    clock.advance(1.0)

    assert (waiting.route_sessions(PLANS[0]), list(waiting.route_paces(PLANS[0]))) == (1, [])
    assert (prefilling.route_sessions(PLANS[0]), list(prefilling.route_paces(PLANS[0]))) == (1, [])
    assert list(streaming.route_paces(PLANS[0])) == [Pace(30, 3.0, 2.0)]
    assert list(resent.route_paces(PLANS[0])) == []
    assert list(load.snapshot().route_paces(PLANS[0])) == [Pace(4, 2.0, 1.0)]


def test_a_request_whose_choices_stream_together_shows_one_pace_the_first_sent():
    """One sample is taken per request, so its several choices are one pace, not n;
    not the fastest choice's (that would flatter the route), the one sent first."""
    clock = ManualClock()
    load = RouteLoad(clock=clock)
    chosen, first, second = decision(), object(), object()
    route_session_open(decision=chosen, stream=first, load=load)
    clock.advance(0.1)
    route_session_open(decision=chosen, stream=second, load=load)
    route_session_touch(decision=chosen, stream=first, tokens=1, load=load)
    route_session_touch(decision=chosen, stream=second, tokens=1, load=load)
    clock.advance(1.0)
    route_session_touch(decision=chosen, stream=first, tokens=9, load=load)
    route_session_touch(decision=chosen, stream=second, tokens=21, load=load)

    snapshot = load.snapshot()

    assert (snapshot.route_sessions(PLANS[0]), list(snapshot.route_paces(PLANS[0]))) == (
        2,
        # pytest.approx stands in for the seconds: Pace compares field by field.
        [Pace(9, cast(float, pytest.approx(1.1)), 1.0)],
    )


def test_a_stream_opened_with_its_planned_length_shows_it_in_its_pace():
    """The proxy opens each stream with its ``max_tokens`` less what it produced on earlier
    routes; the pace carries it, so the policy can read the pace against it."""
    clock = ManualClock()
    load = RouteLoad(clock=clock)
    chosen, stream = decision(), object()
    route_session_open(decision=chosen, stream=stream, planned=200, load=load)
    clock.advance(1.0)
    route_session_touch(decision=chosen, stream=stream, tokens=1, load=load)
    clock.advance(1.0)
    route_session_touch(decision=chosen, stream=stream, tokens=11, load=load)

    assert list(load.snapshot().route_paces(PLANS[0])) == [Pace(11, 2.0, 1.0, planned=200)]


@settings(max_examples=200, deadline=None)
@given(
    first=st.floats(min_value=0.0, max_value=30.0),
    per_token=st.floats(min_value=1e-4, max_value=2.0),
    planned=st.integers(min_value=2, max_value=4096),
    share=st.floats(min_value=0.0, max_value=1.0),
)
def test_a_pace_that_keeps_its_rate_projects_the_sample_its_request_will_give(
    first, per_token, planned, share
):
    """Whenever it is read, a request streaming at a steady rate to its planned length
    projects the tokens/s its sample shows at the end: its wait for the first token
    weighs as it will, not spread over the few tokens it has so far."""
    tokens = 2 + round(share * (planned - 2))
    pace = Pace(tokens, first + per_token * (tokens - 1), per_token * (tokens - 1), planned)
    ended = Pace(planned, first + per_token * (planned - 1), per_token * (planned - 1), planned)

    assert pace.projected() == pytest.approx(planned / ended.seconds, rel=1e-9)
    assert ended.projected() == pytest.approx(ended.tokens / ended.seconds, rel=1e-9)


def test_a_pace_without_a_planned_length_is_the_sample_as_if_it_ended_now():
    assert Pace(30, 3.0, 2.0).projected() == pytest.approx(10.0)
    assert Pace(30, 3.0, 2.0, planned=20).projected() == pytest.approx(10.0)  # past it


def test_a_touch_after_the_close_does_not_bring_the_session_back():
    load = RouteLoad()
    chosen = decision()
    load.open(chosen)
    route_session_close(decision=chosen, load=load)

    route_session_touch(decision=chosen, load=load)

    assert load.snapshot().route_sessions(PLANS[0]) == 0


def test_each_choice_streaming_on_one_decision_counts_until_its_own_stream_ends():
    load = RouteLoad()
    chosen = decision()
    load.open(chosen)  # route_choose: the request, not streaming yet
    first, second = object(), object()  # two choices of one request (n=2)

    route_session_open(decision=chosen, stream=first, load=load)
    route_session_open(decision=chosen, stream=second, load=load)
    both = load.snapshot().route_sessions(PLANS[0])
    route_session_close(decision=chosen, stream=first, load=load)
    one_left = load.snapshot().route_sessions(PLANS[0])
    route_session_close(decision=chosen, stream=second, load=load)

    assert (both, one_left, load.snapshot().route_sessions(PLANS[0])) == (2, 1, 0)


def test_closing_the_decision_ends_the_request_before_or_during_its_streams():
    load = RouteLoad()
    cancelled_early, cancelled_streaming = decision(), decision()
    load.open(cancelled_early)  # chosen, cancelled before its first stream
    load.open(cancelled_streaming)
    route_session_open(decision=cancelled_streaming, stream=object(), load=load)

    route_session_close(decision=cancelled_early, load=load)
    route_session_close(decision=cancelled_streaming, load=load)

    assert load.snapshot().route_sessions(PLANS[0]) == 0
