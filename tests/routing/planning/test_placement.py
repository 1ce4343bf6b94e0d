"""Where a new node is placed (routing_app.planning.placement): uncovered first, then the
weakest stage."""

from __future__ import annotations

import pytest

from routing_app.learning.arms import ArmStatus, ArmView
from routing_app.planning.placement import (
    NodeTooSmall,
    Offer,
    PlacementRule,
    Stage,
    node_capacity_tps,
    place,
    placement_plan,
)
from routing_app.planning.route_plan import NodeRecord
from routing_app.planning.search import enumerate_routes


def node(
    node_id: str, start: int, end: int, tps: float = 10.0, measured: float = 0.0, **load: int
) -> NodeRecord:
    return NodeRecord(node_id, f"http://{node_id}", start, end, tps, measured, **load)


def test_the_first_node_of_a_model_is_offered_every_layer() -> None:
    offer = place(placement_plan([], 4))
    assert (offer.start_layer, offer.end_layer, offer.rule) == (0, 3, PlacementRule.UNCOVERED)
    assert offer.reason == "layers 0-3 are served by no node"


def test_uncovered_layers_come_first_even_when_a_stage_is_weaker() -> None:
    nodes = [node("head", 0, 1, tps=1.0), node("mid", 2, 3, tps=500.0)]
    offer = place(placement_plan(nodes, 8))
    assert (offer.start_layer, offer.end_layer, offer.rule) == (4, 7, PlacementRule.UNCOVERED)


def test_the_earliest_gap_is_offered_first() -> None:
    nodes = [node("a", 2, 3), node("b", 6, 7)]
    offer = place(placement_plan(nodes, 8))
    assert (offer.start_layer, offer.end_layer) == (0, 1)


def test_with_every_layer_served_the_least_capacity_stage_is_offered() -> None:
    nodes = [
        node("head-1", 0, 1, tps=100.0),
        node("head-2", 0, 1, tps=80.0),
        node("tail", 2, 3, tps=150.0),
    ]
    offer = place(placement_plan(nodes, 4))
    assert (offer.start_layer, offer.end_layer) == (2, 3)
    assert offer.rule is PlacementRule.LEAST_CAPACITY
    assert offer.reason == (
        "every layer is served; stage 2-3 has the least capacity (150.0 tok/s over 1 node)"
    )


def test_stages_are_cut_at_every_shard_boundary_and_sum_their_nodes_capacity() -> None:
    nodes = [node("whole", 0, 3, tps=40.0), node("head", 0, 1, tps=100.0)]
    plan = placement_plan(nodes, 4)
    assert plan.stages == (
        Stage(0, 1, ("head", "whole"), 140.0),
        Stage(2, 3, ("whole",), 40.0),
    )
    assert plan.uncovered == ()
    assert (place(plan).start_layer, place(plan).end_layer) == (2, 3)


def test_capacity_is_the_benchmark_capped_by_the_measured_speed_without_the_load() -> None:
    busy = node("busy", 0, 3, tps=100.0, measured=60.0, active_sessions=3, queue_depth=2)
    assert node_capacity_tps(busy) == 60.0
    assert placement_plan([busy], 4).stages[0].capacity_tps == 60.0


def test_equal_capacity_stages_prefer_fewer_nodes_then_the_earlier_one() -> None:
    nodes = [node("h1", 0, 1, tps=5.0), node("h2", 0, 1, tps=5.0), node("t", 2, 3, tps=10.0)]
    assert place(placement_plan(nodes, 4)).start_layer == 2
    even = [node("h", 0, 1), node("t", 2, 3)]
    assert place(placement_plan(even, 4)).start_layer == 0


def test_a_node_takes_as_many_layers_of_its_range_as_its_memory_holds() -> None:
    offer = place(placement_plan([node("head", 0, 1)], 30), max_layers=10)
    assert (offer.start_layer, offer.end_layer) == (2, 11)
    assert offer.reason == "layers 2-29 are served by no node; this node holds 10 of its 28 layers"
    roomy = place(placement_plan([node("head", 0, 1)], 30), max_layers=100)
    assert (roomy.start_layer, roomy.end_layer) == (2, 29)


def test_a_node_that_holds_no_whole_layer_is_refused_with_what_to_change() -> None:
    with pytest.raises(NodeTooSmall, match="holds no whole layer") as refused:
        place(placement_plan([node("head", 0, 1)], 4), max_layers=0)
    assert refused.value.code == "node_too_small"
    assert "--memory-gb" in str(refused.value)


def test_shards_past_the_models_layers_are_clipped() -> None:
    plan = placement_plan([node("odd", 2, 9)], 4)
    assert plan.stages == (Stage(2, 3, ("odd",), 10.0),)
    assert plan.uncovered == ((0, 1),)


def test_a_nodes_claims_alone_move_no_other_node_once_routes_are_measured() -> None:
    head, tail = node("head", 0, 1, tps=10.0), node("tail", 2, 3, tps=30.0)
    claimant = node("claimant", 0, 1, tps=1e6, measured=1e6)  # answered the challenge, no more
    nodes = [head, tail, claimant]
    arms = [
        ArmView(route, ArmStatus.PROVEN, 7.0, 5.0, 5, 1.0)  # head -> tail, timed at 7 tok/s
        if route.node_ids == ("head", "tail")
        else ArmView(route, ArmStatus.UNSAMPLED, None, 0.0, 0, 0.0)
        for route in enumerate_routes(model_key="m", num_layers=4, nodes=nodes)
    ]
    plan = placement_plan(nodes, 4, arms)
    head_stage, tail_stage = plan.stages
    assert head_stage.node_ids == ("claimant", "head")
    assert head_stage.capacity_tps == 10.0  # the claimant counts nothing
    # The tail's 30 tok/s is floored: no layer runs faster than the timed route's do.
    assert 10.0 < tail_stage.capacity_tps < 11.0
    assert _range(place(plan)) == _range(place(placement_plan([head, tail], 4))) == (0, 1)
    # Once a route through it is timed, the claimant counts, at most at that floor.
    timed = [
        ArmView(arm.plan, ArmStatus.PROVEN, 7.0, 5.0, 5, 1.0)
        if arm.plan.node_ids == ("claimant", "tail")
        else arm
        for arm in arms
    ]
    assert 10.0 < placement_plan(nodes, 4, timed).stages[0].capacity_tps < 25.0
    # With no route measured the claims are all there is.
    assert place(placement_plan(nodes, 4)).start_layer == 2


def _range(offer: Offer) -> tuple[int, int]:
    return offer.start_layer, offer.end_layer
