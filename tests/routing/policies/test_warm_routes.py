"""Cache-aware choice (ADR-0029): a request's warmth on a route (the ln speed-up of the
prefix its nodes hold) weighed with the route's speed and load, by both policies, and by
``route_choose`` from what the tracker's prefix memory learned."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from nodes_app.models import TopologyEpoch
from routing_app.learning.arms import ArmStatus, ArmView
from routing_app.learning.prefix_memory import PrefixMemory, RequestPrefix
from routing_app.planning.search import enumerate_routes
from routing_app.policies.config import POLICY_ADR0021, RoutePolicyConfig
from routing_app.policies.load import NO_LOAD, LoadSnapshot
from routing_app.services import route_choose, route_served_record, route_session_close
from tests.support.routing import make_model, make_node, record

NODES = [record("a", 0, 29), record("b", 0, 29)]
A, B = sorted(enumerate_routes(model_key="m", num_layers=30, nodes=NODES), key=lambda p: p.node_ids)
POLICIES = {
    "thompson-load": RoutePolicyConfig(),
    "adr0021": RoutePolicyConfig(policy=POLICY_ADR0021, explore_share=0.0),
}


def proven(plan, tps: float) -> ArmView:
    return ArmView(plan, ArmStatus.PROVEN, tps, 5.0, 5, 1.0)


def shares_of_a(config: RoutePolicyConfig, arms, *, warm=None, loads=NO_LOAD) -> float:
    rng = random.Random(5)
    policy = config.route_policy()
    picks: Counter[str] = Counter()
    for _ in range(2000):
        pick = policy.choose(arms, rng=rng, loads=loads, warm=warm or {})
        assert pick is not None
        picks[pick.arm.plan.signature] += 1
    return picks[A.signature] / 2000


THOMPSON = POLICIES["thompson-load"]


def test_a_conversation_goes_back_to_the_equally_fast_route_holding_its_history() -> None:
    arms = [proven(A, 20.0), proven(B, 20.0)]

    assert 0.35 < shares_of_a(THOMPSON, arms) < 0.65
    assert shares_of_a(THOMPSON, arms, warm={A.signature: math.log(3.0)}) > 0.9


def test_a_much_faster_route_still_wins_over_a_little_warmth() -> None:
    arms = [proven(A, 4.0), proven(B, 40.0)]

    assert shares_of_a(THOMPSON, arms, warm={A.signature: math.log(1.5)}) < 0.1


@pytest.mark.parametrize("speedup", [1.5, 3.0])
def test_adr0021_splits_by_speed_counting_a_warm_route_as_that_much_faster(speedup) -> None:
    config = POLICIES["adr0021"]
    arms = [proven(A, 20.0), proven(B, 30.0)]
    weight = (20.0 * speedup) ** config.weight_alpha

    share = shares_of_a(config, arms, warm={A.signature: math.log(speedup)})

    assert share == pytest.approx(weight / (weight + 30.0**config.weight_alpha), abs=0.03)


def test_a_warm_route_saturated_with_requests_sheds_them_to_a_cold_one() -> None:
    arms = [proven(A, 20.0), proven(B, 20.0)]
    loads = LoadSnapshot(routes={A.signature: 30})

    assert shares_of_a(POLICIES["thompson-load"], arms, warm={A.signature: 0.4}, loads=loads) < 0.2


@pytest.mark.django_db
def test_route_choose_sends_the_next_turn_where_the_memory_says_its_prefix_is(store, clock) -> None:
    model = make_model(num_layers=30)
    make_node(model, "left", 0, 29)
    make_node(model, "right", 0, 29)
    TopologyEpoch.objects.filter(model=model).update(number=1)
    memory = PrefixMemory(clock=clock)
    turn = RequestPrefix(
        blocks=tuple(f"h{i}" for i in range(20)), prompt_tokens=650, output_tokens=256
    )
    first = route_choose(model=model, rng=random.Random(1), memory=memory, prefix=turn)
    for signature in (f"{model.key} | left[0-29]", f"{model.key} | right[0-29]"):
        for _ in range(3):
            store.arms.record_sample(
                model_key=model.key,
                signature=signature,
                epoch=1,
                output_tokens=64,
                tokens_per_second=10.0,
            )
    route_served_record(
        decision=first,
        prefix=turn,
        cached_tokens=0,
        first_token_seconds=4.0,
        output_tokens=40,
        elapsed_seconds=8.0,
        memory=memory,
    )
    route_session_close(decision=first)
    rng = random.Random(2)
    cold = RequestPrefix(tuple(f"x{i}" for i in range(20)), prompt_tokens=650, output_tokens=256)

    def chosen(prefix: RequestPrefix) -> Counter[str]:
        counted: Counter[str] = Counter()
        for _ in range(200):
            decision = route_choose(model=model, rng=rng, memory=memory, prefix=prefix)
            route_session_close(decision=decision)
            counted[decision.plan.signature] += 1
        return counted

    # 4 s of prefill over 650 tokens, 0.1 s an answer token, 40 tokens an answer:
    # 8 s cold on either route, 2 s warm on the first turn's.
    assert chosen(turn)[first.plan.signature] > 190
    assert chosen(cold)[first.plan.signature] < 150
