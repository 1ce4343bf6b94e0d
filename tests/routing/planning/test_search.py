"""Candidate enumeration: every complete route the nodes form, best prior first, within the cap."""

from __future__ import annotations

import random

from routing_app.planning.search import MAX_CANDIDATES, enumerate_routes
from tests.support.routing import record

MIXED = [record("gpu-abc", 0, 21, tps=11164.0), record("cpu-def", 0, 39, tps=425.0)]


def plans_for(nodes, num_layers=40, **kwargs):
    return enumerate_routes(model_key="qwen", num_layers=num_layers, nodes=nodes, **kwargs)


def test_it_plans_the_hybrid_route_with_the_tail_starting_at_layer_22():
    plans = plans_for(MIXED)

    hybrid = next(plan for plan in plans if len(plan.hops) == 2)
    assert hybrid.head.node_id == "gpu-abc"
    assert [(h.node_id, h.start_layer, h.end_layer) for h in hybrid.hops] == [
        ("gpu-abc", 0, 21),
        ("cpu-def", 22, 39),
    ]


def test_it_plans_the_single_full_node_route_next_to_the_hybrid_one():
    plans = plans_for(MIXED)

    assert sorted(plan.signature for plan in plans) == [
        "qwen | cpu-def[0-39]",
        "qwen | gpu-abc[0-21] -> cpu-def[22-39]",
    ]


def test_it_gives_the_hybrid_route_its_bottleneck_hops_prior():
    plans = plans_for(MIXED)

    assert [plan.prior_tps for plan in plans] == [425.0, 425.0]


def test_it_ranks_the_route_with_fewer_hops_first_on_equal_priors():
    plans = plans_for(MIXED)

    assert plans[0].signature == "qwen | cpu-def[0-39]"


def test_it_sends_the_request_to_the_head_of_the_chosen_plan():
    """ADR-0020 regression: head and downstream hops come from one value."""
    hybrid = plans_for(MIXED)[1]

    assert hybrid.head is hybrid.hops[0]
    assert hybrid.head.endpoint == "http://gpu-abc.test:7000"
    assert hybrid.to_dict()[1] == {
        "node_id": "cpu-def",
        "endpoint": "http://cpu-def.test:7000",
        "start_layer": 22,
        "end_layer": 39,
    }


def test_it_offers_every_route_through_overlapping_shards_fewest_hops_first():
    nodes = [
        record("head", 0, 9),
        record("short", 10, 14, tps=1000.0),
        record("long", 5, 24),
        record("tail", 20, 29),
    ]

    plans = plans_for(nodes, num_layers=30)

    assert [plan.node_ids for plan in plans] == [
        ("head", "long", "tail"),
        ("head", "short", "long", "tail"),
    ]
    assert [(h.start_layer, h.end_layer) for h in plans[1].hops] == [
        (0, 9),
        (10, 14),
        (15, 24),
        (25, 29),
    ]


def test_two_heads_and_two_tails_give_four_candidates():
    nodes = [
        record("head-a", 0, 1, tps=100.0),
        record("head-b", 0, 1, tps=90.0),
        record("tail-a", 2, 3, tps=80.0),
        record("tail-b", 2, 3, tps=70.0),
    ]

    plans = plans_for(nodes, num_layers=4)

    assert [(plan.node_ids, plan.prior_tps) for plan in plans] == [
        (("head-a", "tail-a"), 80.0),
        (("head-b", "tail-a"), 80.0),
        (("head-a", "tail-b"), 70.0),
        (("head-b", "tail-b"), 70.0),
    ]


def test_the_tail_after_a_head_is_a_candidate_next_to_the_full_node_adr_0020s_mixed_topology():
    nodes = [
        record("partial-head", 0, 21),
        record("full", 0, 29),
        record("head", 0, 14),
        record("tail", 15, 29),
    ]

    signatures = {plan.signature for plan in plans_for(nodes, num_layers=30)}

    assert {
        "qwen | full[0-29]",
        "qwen | head[0-14] -> tail[15-29]",
        "qwen | head[0-14] -> full[15-29]",
        "qwen | partial-head[0-21] -> tail[22-29]",
        "qwen | partial-head[0-21] -> full[22-29]",
    } <= signatures


def test_every_head_leads_a_candidate():
    nodes = [record("a", 0, 9), record("b", 0, 14), record("c", 0, 4), record("tail", 5, 29)]

    plans = plans_for(nodes, num_layers=30)

    assert {plan.head.node_id for plan in plans} == {"a", "b", "c"}
    assert len({plan.signature for plan in plans}) == len(plans)


def test_a_slow_replica_is_still_in_a_candidate_when_the_cap_is_full():
    heads = [record(f"head-{i:02}", 0, 14, tps=float(100 + i)) for i in range(4)]
    tails = [record(f"tail-{i:02}", 15, 29, tps=float(200 + i)) for i in range(6)]
    slow = record("slow-tail", 15, 29, tps=1.0)

    plans = plans_for([*heads, *tails, slow], num_layers=30, limit=8)

    assert len(plans) == 8
    assert any("slow-tail" in plan.node_ids for plan in plans)


def test_it_drops_a_head_that_cannot_reach_the_last_layer():
    nodes = [record("stranded", 0, 9), record("far", 15, 29)]

    assert plans_for(nodes, num_layers=30) == []


def test_it_drops_a_head_whose_only_continuation_is_avoided():
    nodes = [record("head", 0, 9), record("tail", 10, 29), record("full", 0, 29)]

    plans = plans_for(nodes, num_layers=30, avoid=frozenset({"tail", "full"}))

    assert plans == []


def test_it_scales_the_prior_by_the_bottleneck_hops_reputation():
    nodes = [record("a", 0, 29, tps=100.0, reputation=0.5), record("b", 0, 29, tps=80.0)]

    plans = plans_for(nodes, num_layers=30)

    assert [(plan.head.node_id, plan.prior_tps) for plan in plans] == [("b", 80.0), ("a", 50.0)]


def test_it_adjusts_throughput_for_queued_and_running_requests():
    busy = record("busy", 0, 29, tps=300.0, queue_depth=1, active_sessions=1)
    measured = record("measured", 0, 29, tps=300.0, measured_tps=120.0)

    assert busy.effective_tps == 100.0
    assert measured.effective_tps == 120.0


def test_it_keeps_at_most_max_candidates_best_prior_first():
    nodes = [record(f"n{i:02}", 0, 29, tps=float(10 + i)) for i in range(MAX_CANDIDATES + 4)]

    plans = plans_for(nodes, num_layers=30)

    assert [plan.prior_tps for plan in plans] == [
        float(10 + i) for i in reversed(range(4, MAX_CANDIDATES + 4))
    ]


def test_it_routes_around_avoided_nodes():
    nodes = [record("head", 0, 9), record("fast", 10, 29, tps=900.0), record("slow", 5, 29)]

    (plan,) = plans_for(nodes, num_layers=30, avoid=frozenset({"slow"}))

    assert plan.node_ids == ("head", "fast")


def test_it_is_deterministic_whatever_the_order_of_the_nodes():
    nodes = [record(f"n{i}", i * 3 % 20, min(29, i * 3 % 20 + 12)) for i in range(12)]
    expected = plans_for(nodes, num_layers=30)
    shuffled = list(nodes)
    random.Random(4).shuffle(shuffled)

    assert plans_for(shuffled, num_layers=30) == expected
