"""The routing services: a request's route choice (candidates, pinning, the policy, the
answer when no route can serve) and what it learns from the request."""

from __future__ import annotations

import random

import pytest
from rest_framework import status

from meshnet_site.errors import http_error
from nodes_app.models import NodeStatus, TopologyEpoch
from routing_app.planning.pinned import PinnedNodeUnavailable
from routing_app.policies.choice import DecisionMode, NoRouteAvailable
from routing_app.policies.config import POLICY_ADR0021, RoutePolicyConfig
from routing_app.policies.load import RouteLoad
from routing_app.selectors import route_candidates
from routing_app.services import route_choose, route_sample_record, route_session_close
from tests.support.routing import make_model, make_node

pytestmark = pytest.mark.django_db


def test_it_answers_503_when_every_candidate_is_kept_out(store):
    model = make_model(num_layers=30)
    for node_id in ("fast", "slow", "third"):
        make_node(model, node_id, 0, 29)
        store.exclusions.ban_node(node_id=node_id, seconds=3600)

    with pytest.raises(NoRouteAvailable) as caught:
        route_choose(model=model, rng=random.Random(7))

    assert http_error(caught.value).status == status.HTTP_503_SERVICE_UNAVAILABLE


def test_it_returns_the_decision_with_its_plan_mode_and_epoch(store):
    model = make_model(num_layers=30)
    make_node(model, "fast", 0, 29, tps=300.0)
    TopologyEpoch.objects.filter(model=model).update(number=4)
    for _ in range(3):
        store.arms.record_sample(
            model_key=model.key,
            signature=f"{model.key} | fast[0-29]",
            epoch=4,
            output_tokens=64,
            tokens_per_second=60.0,
        )

    decision = route_choose(
        model=model,
        rng=random.Random(7),
        config=RoutePolicyConfig(policy=POLICY_ADR0021, explore_share=0.0),
    )

    assert decision.epoch == 4
    assert decision.to_dict() == {
        "route": f"{model.key} | fast[0-29]",
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


def test_it_prefers_the_single_full_node_over_the_hybrid_route_at_cold_start(store):
    model = make_model(num_layers=40)
    make_node(model, "gpu-abc", 0, 21, tps=11164.0)
    make_node(model, "cpu-def", 0, 39, tps=425.0)

    decision = route_choose(model=model, rng=random.Random(3))

    assert decision.mode is DecisionMode.GREEDY_FALLBACK
    assert decision.plan.signature == f"{model.key} | cpu-def[0-39]"


def test_it_learns_from_a_pinned_route_like_from_any_other(store):
    model = make_model(num_layers=40)
    make_node(model, "gpu-abc", 0, 21, tps=11164.0)
    make_node(model, "cpu-def", 0, 39, tps=425.0)
    pinned = route_choose(model=model, pinned=["gpu-abc", "cpu-def"], rng=random.Random(3))

    assert route_sample_record(decision=pinned, output_tokens=100, elapsed_seconds=2.0)

    decision = route_choose(model=model, rng=random.Random(3))
    assert decision.mode in (DecisionMode.EXPLOIT, DecisionMode.SCOUT)
    assert store.arms.arm(model_key=model.key, signature=pinned.plan.signature).value == 50.0


def test_it_answers_503_naming_the_layers_no_online_node_serves(store):
    model = make_model(num_layers=30)
    make_node(model, "head", 0, 9)
    make_node(model, "middle", 12, 20)

    with pytest.raises(NoRouteAvailable) as caught:
        route_choose(model=model, rng=random.Random(3))

    assert http_error(caught.value).status == status.HTTP_503_SERVICE_UNAVAILABLE
    assert "no online node serves layers 10-11, 21-29 (of 0-29)" in caught.value.message


def test_with_every_route_kept_out_it_says_whether_bans_or_quarantines_keep_them_out(store):
    model = make_model(num_layers=30)
    make_node(model, "solo", 0, 29)
    [plan] = route_candidates(model=model, store=store)

    store.exclusions.quarantine_route(model_key=model.key, signature=plan.signature, seconds=60)
    with pytest.raises(NoRouteAvailable) as quarantined:
        route_choose(model=model, rng=random.Random(3))
    store.exclusions.ban_node(node_id="solo", seconds=60)
    with pytest.raises(NoRouteAvailable) as banned:
        route_choose(model=model, rng=random.Random(3))

    assert "every candidate route is quarantined" in quarantined.value.message
    assert "goes through a banned node (solo)" in banned.value.message


def test_a_chosen_route_counts_as_load_until_its_request_is_recorded_or_closed(store):
    model = make_model(num_layers=30)
    make_node(model, "solo", 0, 29, tps=50.0)
    load = RouteLoad()
    first = route_choose(model=model, load=load)
    second = route_choose(model=model, load=load)
    in_flight = load.snapshot().route_sessions(first.plan)

    route_sample_record(decision=first, output_tokens=64, elapsed_seconds=1.0, load=load)
    route_session_close(decision=second, load=load)
    route_session_close(decision=second, load=load)

    assert (in_flight, load.snapshot().route_sessions(first.plan)) == (2, 0)


def test_it_pins_a_route_through_the_registry_and_still_names_its_head(store):
    model = make_model(num_layers=40)
    make_node(model, "gpu-abc", 0, 21, tps=11164.0)
    make_node(model, "cpu-def", 0, 39, tps=425.0)

    decision = route_choose(model=model, pinned=["gpu-abc", "cpu-def"], rng=random.Random(1))

    assert decision.mode is DecisionMode.PINNED
    assert decision.plan.head.endpoint == "http://gpu-abc.test:7000"
    assert decision.to_dict()["hops"][1]["start_layer"] == 22


def test_it_answers_503_when_a_pinned_node_of_the_registry_is_offline(store):
    model = make_model(num_layers=30)
    make_node(model, "gone", 0, 29, status=NodeStatus.OFFLINE)

    with pytest.raises(PinnedNodeUnavailable) as caught:
        route_choose(model=model, pinned=["gone"], rng=random.Random(1))

    assert http_error(caught.value).status == status.HTTP_503_SERVICE_UNAVAILABLE
