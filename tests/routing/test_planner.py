"""Route plans, candidate enumeration and pinned routes."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from rest_framework import status

from meshnet_site.errors import http_error
from nodes_app.models import NodeStatus
from routing_app.planning.cache import CandidateCache
from routing_app.planning.pinned import InvalidPinnedRoute, PinnedNodeUnavailable, plan_pinned_route
from routing_app.planning.route_plan import Hop, RoutePlan
from routing_app.planning.search import MAX_CANDIDATES, enumerate_routes
from routing_app.policies.choice import DecisionMode, NoRouteAvailable
from routing_app.selectors import route_candidates, routing_nodes
from routing_app.services import route_choose
from tests.support.routing import ManualClock, make_model, make_node, record

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


def test_it_cannot_build_a_plan_whose_downstream_hop_restarts_at_layer_zero():
    """The ADR-0020 bug (downstream start_layer 0 after a 0-21 head) is unconstructible."""
    with pytest.raises(ValueError, match="must start at layer 22"):
        RoutePlan(
            "qwen",
            39,
            (Hop("gpu-abc", "http://gpu", 0, 21), Hop("cpu-def", "http://cpu", 0, 39)),
        )


def test_it_refuses_a_plan_that_stops_short_of_the_last_layer():
    with pytest.raises(ValueError, match="last layer is 39"):
        RoutePlan("qwen", 39, (Hop("gpu-abc", "http://gpu", 0, 21),))


def test_it_writes_the_signature_with_the_layers_each_hop_runs():
    plans = enumerate_routes(
        model_key="smollm2-135m",
        num_layers=30,
        nodes=[record("gpu-abc", 0, 21, tps=500.0), record("cpu-def", 10, 29, tps=50.0)],
    )

    assert [plan.signature for plan in plans] == ["smollm2-135m | gpu-abc[0-21] -> cpu-def[22-29]"]


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


# --- pinned routes ---------------------------------------------------------------------


def pin(node_ids, nodes=MIXED, known=()):
    return plan_pinned_route(
        model_key="qwen",
        num_layers=40,
        node_ids=node_ids,
        online={node.node_id: node for node in nodes},
        known=known,
    )


def test_it_plans_a_pinned_hybrid_route_from_layer_22_on_the_full_node():
    plan = pin(["gpu-abc", "cpu-def"])

    assert plan.signature == "qwen | gpu-abc[0-21] -> cpu-def[22-39]"
    assert plan.prior_tps == 425.0


@pytest.mark.parametrize(
    ("node_ids", "message"),
    [
        ([], "empty"),
        (["cpu-def", "cpu-def"], "more than once"),
        (["gpu-abc"], "ends at layer 21"),
        (["gpu-abc", "cpu-def", "gpu-abc"], "more than once"),
        (["cpu-def", "gpu-abc"], "already reached the last layer"),
        (["nobody"], "not a node of qwen"),
    ],
)
def test_it_rejects_an_invalid_pinned_route_with_a_400(node_ids, message):
    with pytest.raises(InvalidPinnedRoute, match=message) as caught:
        pin(node_ids)

    assert http_error(caught.value).status == status.HTTP_400_BAD_REQUEST
    assert caught.value.code == "invalid_route"


def test_it_rejects_a_pinned_hop_that_does_not_hold_the_next_layer():
    nodes = [record("a", 0, 9), record("b", 12, 29)]

    with pytest.raises(InvalidPinnedRoute, match="holds layers 12-29 and cannot run from layer 10"):
        plan_pinned_route(
            model_key="qwen",
            num_layers=30,
            node_ids=["a", "b"],
            online={n.node_id: n for n in nodes},
        )


def test_it_answers_503_for_a_pinned_node_that_is_not_online():
    with pytest.raises(PinnedNodeUnavailable, match="not online") as caught:
        pin(["gone"], known=["gone"])

    assert http_error(caught.value).status == status.HTTP_503_SERVICE_UNAVAILABLE


# --- the candidate cache (ADR-0018) ----------------------------------------------------

REPLICAS = [
    record("head-a", 0, 19, tps=300.0),
    record("head-b", 0, 19, tps=200.0),
    record("tail-a", 20, 39, tps=250.0),
    record("tail-b", 20, 39, tps=150.0),
]


def cached_routes(cache, nodes, **kwargs):
    return cache.routes(model_key="qwen", num_layers=40, nodes=nodes, **kwargs)


def test_the_cache_gives_the_enumerations_candidates_whatever_the_records_order():
    cache = CandidateCache(clock=ManualClock())

    first = cached_routes(cache, REPLICAS)
    again = cached_routes(cache, list(reversed(REPLICAS)))

    assert first == again == plans_for(REPLICAS)
    assert [plan.prior_tps for plan in again] == [plan.prior_tps for plan in plans_for(REPLICAS)]


def test_a_node_joining_is_in_a_candidate_at_once():
    cache = CandidateCache(clock=ManualClock())
    cached_routes(cache, REPLICAS)

    plans = cached_routes(cache, [*REPLICAS, record("tail-c", 20, 39, tps=50.0)])

    assert plans == plans_for([*REPLICAS, record("tail-c", 20, 39, tps=50.0)])
    assert any("tail-c" in plan.node_ids for plan in plans)


def test_a_node_leaving_is_in_no_candidate_at_once():
    cache = CandidateCache(clock=ManualClock())
    cached_routes(cache, REPLICAS)

    plans = cached_routes(cache, REPLICAS[1:])

    assert plans and all("head-a" not in plan.node_ids for plan in plans)


def test_a_banned_node_is_in_no_candidate_at_once():
    cache = CandidateCache(clock=ManualClock())
    cached_routes(cache, REPLICAS)

    plans = cached_routes(cache, REPLICAS, avoid=frozenset({"tail-a"}))

    assert [plan.node_ids for plan in plans] == [("head-a", "tail-b"), ("head-b", "tail-b")]


def test_a_ban_of_another_models_node_keeps_the_cached_candidates():
    clock = ManualClock()
    cache = CandidateCache(clock=clock, reselect_after=1.0)
    first = cached_routes(cache, REPLICAS)
    clock.advance(5.0)

    again = cached_routes(cache, REPLICAS, avoid=frozenset({"elsewhere"}))

    assert again == first and all(a is b for a, b in zip(again, first, strict=True))


def test_a_node_moving_its_shard_changes_the_candidates_at_once():
    cache = CandidateCache(clock=ManualClock())
    cached_routes(cache, REPLICAS)
    moved = [*REPLICAS[:3], record("tail-b", 0, 39, tps=150.0)]  # now the whole model

    plans = cached_routes(cache, moved)

    assert plans == plans_for(moved)
    assert ("tail-b",) in [plan.node_ids for plan in plans]


def test_the_kept_routes_take_the_nodes_current_scores_and_rank_at_once():
    cache = CandidateCache(clock=ManualClock())
    cached_routes(cache, REPLICAS)
    busy = [replace(REPLICAS[0], queue_depth=9), *REPLICAS[1:]]  # head-a: 300 / 10 tok/s

    plans = cached_routes(cache, busy)

    assert plans == plans_for(busy)
    assert [plan.prior_tps for plan in plans] == [plan.prior_tps for plan in plans_for(busy)]
    assert plans[-1].node_ids[0] == "head-a" and plans[-1].prior_tps == 30.0
    assert plans[-1].layer_seconds == plans_for(busy)[-1].layer_seconds


def test_the_routes_are_selected_again_by_score_after_the_reselect_interval():
    clock = ManualClock()
    cache = CandidateCache(clock=clock, reselect_after=1.0)
    full = [record("a", 0, 39, tps=300.0), record("b", 0, 39, tps=200.0)]
    third = record("c", 0, 39, tps=100.0)
    assert [p.node_ids for p in cached_routes(cache, [*full, third], limit=2)] == [("a",), ("b",)]
    faster = [*full, replace(third, benchmark_tps=500.0)]

    kept = cached_routes(cache, faster, limit=2)
    clock.advance(1.0)
    reselected = cached_routes(cache, faster, limit=2)

    assert [plan.node_ids for plan in kept] == [("a",), ("b",)]
    assert [plan.node_ids for plan in reselected] == [("c",), ("a",)]
    assert reselected == plans_for(faster, limit=2)


# --- registry rows -----------------------------------------------------------------------


@pytest.mark.django_db
def test_it_routes_only_over_online_nodes():
    model = make_model(num_layers=30)
    make_node(model, "online", 0, 29)
    for state in (NodeStatus.OFFLINE, NodeStatus.DRAINING, NodeStatus.BANNED):
        make_node(model, f"node-{state}", 0, 29, tps=1000.0, status=state)

    assert [node.node_id for node in routing_nodes(model=model)] == ["online"]


@pytest.mark.django_db
def test_it_lists_quarantined_routes_after_routing_around_the_held_node(store):
    model = make_model(num_layers=30)
    make_node(model, "head", 0, 9)
    make_node(model, "fast", 10, 29, tps=900.0)
    make_node(model, "slow", 5, 29, tps=50.0)
    store.exclusions.ban_node(node_id="fast", seconds=60)

    plans = route_candidates(model=model, store=store)

    assert [plan.node_ids for plan in plans] == [("head", "fast"), ("head", "slow")]
    views = store.views(plans=plans, epoch=1)
    assert [str(view.status) for view in views] == ["quarantined", "unsampled"]


@pytest.mark.django_db
def test_a_node_gone_offline_or_banned_leaves_the_live_candidates_at_once(store):
    model = make_model(num_layers=30)
    make_node(model, "head", 0, 9)
    fast = make_node(model, "fast", 10, 29, tps=900.0)
    make_node(model, "slow", 10, 29, tps=50.0)
    assert [plan.node_ids for plan in route_candidates(model=model, store=store)] == [
        ("head", "fast"),
        ("head", "slow"),
    ]

    fast.status = NodeStatus.OFFLINE
    fast.save(update_fields=["status"])
    gone = route_candidates(model=model, store=store)
    chosen = route_choose(model=model, rng=random.Random(1))
    store.exclusions.ban_node(node_id="slow", seconds=60)

    assert [plan.node_ids for plan in gone] == [("head", "slow")]
    assert chosen.plan.node_ids == ("head", "slow")
    with pytest.raises(NoRouteAvailable):
        route_choose(model=model, rng=random.Random(1))


@pytest.mark.django_db
def test_it_pins_a_route_through_the_registry_and_still_names_its_head(store):
    model = make_model(num_layers=40)
    make_node(model, "gpu-abc", 0, 21, tps=11164.0)
    make_node(model, "cpu-def", 0, 39, tps=425.0)

    decision = route_choose(model=model, pinned=["gpu-abc", "cpu-def"], rng=random.Random(1))

    assert decision.mode is DecisionMode.PINNED
    assert decision.plan.head.endpoint == "http://gpu-abc.test:7000"
    assert decision.to_dict()["hops"][1]["start_layer"] == 22


@pytest.mark.django_db
def test_it_answers_503_when_a_pinned_node_of_the_registry_is_offline(store):
    model = make_model(num_layers=30)
    make_node(model, "gone", 0, 29, status=NodeStatus.OFFLINE)

    with pytest.raises(PinnedNodeUnavailable) as caught:
        route_choose(model=model, pinned=["gone"], rng=random.Random(1))

    assert http_error(caught.value).status == status.HTTP_503_SERVICE_UNAVAILABLE
