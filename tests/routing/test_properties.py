"""Properties that hold for any network: enumerated routes run every layer once, in order."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing_app.learning.arms import ArmState, ArmStatus, ArmView
from routing_app.planning.cache import RESELECT_SECONDS, CandidateCache
from routing_app.planning.pinned import plan_pinned_route
from routing_app.planning.route_plan import NodeRecord
from routing_app.planning.search import MAX_CANDIDATES, enumerate_routes
from routing_app.policies.config import POLICY_ADR0021, RoutePolicyConfig
from tests.support.routing import ManualClock


@st.composite
def networks(draw: st.DrawFn) -> tuple[int, list[NodeRecord]]:
    num_layers = draw(st.integers(min_value=1, max_value=40))
    count = draw(st.integers(min_value=0, max_value=14))
    nodes = []
    for index in range(count):
        start = draw(st.integers(min_value=0, max_value=num_layers - 1))
        end = draw(st.integers(min_value=start, max_value=num_layers - 1))
        nodes.append(
            NodeRecord(
                node_id=f"n{index}",
                endpoint=f"http://n{index}",
                shard_start=start,
                shard_end=end,
                benchmark_tps=draw(st.floats(min_value=0.0, max_value=1000.0)),
                queue_depth=draw(st.integers(min_value=0, max_value=3)),
                reputation=draw(st.floats(min_value=0.0, max_value=1.0)),
            )
        )
    return num_layers, nodes


def covered(num_layers: int, nodes: list[NodeRecord]) -> bool:
    """Whether any chain of nodes runs layers 0..last (reachability, not greedy)."""
    reach = -1
    for node in sorted(nodes, key=lambda n: n.shard_start):
        if node.shard_start > reach + 1:
            break
        reach = max(reach, node.shard_end)
    return reach >= num_layers - 1 and any(node.shard_start == 0 for node in nodes)


@settings(max_examples=300, deadline=None)
@given(networks())
def test_it_runs_every_layer_exactly_once_in_order_on_every_route(network):
    num_layers, nodes = network
    by_id = {node.node_id: node for node in nodes}

    for plan in enumerate_routes(model_key="m", num_layers=num_layers, nodes=nodes):
        layers = [layer for hop in plan.hops for layer in range(hop.start_layer, hop.end_layer + 1)]
        assert layers == list(range(num_layers))
        assert by_id[plan.head.node_id].shard_start == 0
        for hop in plan.hops:
            node = by_id[hop.node_id]
            assert node.shard_start <= hop.start_layer <= hop.end_layer <= node.shard_end


@settings(max_examples=300, deadline=None)
@given(networks())
def test_it_finds_a_route_whenever_the_nodes_cover_the_model(network):
    num_layers, nodes = network

    plans = enumerate_routes(model_key="m", num_layers=num_layers, nodes=nodes)

    assert bool(plans) == covered(num_layers, nodes)


def all_routes(num_layers: int, nodes: list[NodeRecord]) -> list[tuple[str, ...]]:
    """Every complete route, by brute force: from each position, every node holding it."""
    routes: list[tuple[str, ...]] = []

    def extend(position: int, chain: tuple[str, ...]) -> None:
        if position == num_layers:
            routes.append(chain)
            return
        for node in nodes:
            if node.shard_start <= position <= node.shard_end:
                extend(min(node.shard_end, num_layers - 1) + 1, (*chain, node.node_id))

    extend(0, ())
    return routes


@settings(max_examples=200, deadline=None)
@given(networks(), st.integers(min_value=1, max_value=20))
def test_it_offers_distinct_valid_routes_ranked_by_prior_then_hops_within_the_cap(network, limit):
    num_layers, nodes = network
    by_id = {node.node_id: node for node in nodes}

    plans = enumerate_routes(model_key="m", num_layers=num_layers, nodes=nodes, limit=limit)

    assert len(plans) <= limit
    assert len({plan.signature for plan in plans}) == len(plans)
    keys = [(-plan.prior_tps, len(plan.hops)) for plan in plans]
    assert keys == sorted(keys)
    for plan in plans:
        assert plan.prior_tps == min(by_id[n].score for n in plan.node_ids)


@settings(max_examples=300, deadline=None)
@given(networks())
def test_every_node_on_some_complete_route_is_in_a_candidate_when_the_cap_allows(network):
    num_layers, nodes = network
    routes = all_routes(num_layers, nodes)
    on_a_route = {node_id for route in routes for node_id in route}
    heads = {route[0] for route in routes}

    plans = enumerate_routes(model_key="m", num_layers=num_layers, nodes=nodes)

    if len(routes) <= MAX_CANDIDATES:  # small enough: every complete route is a candidate
        assert sorted(plan.node_ids for plan in plans) == sorted(routes)
    if len(heads) <= MAX_CANDIDATES and len(on_a_route) <= MAX_CANDIDATES:
        assert {n for plan in plans for n in plan.node_ids} == on_a_route
    if plans:
        best = max(min(next(n for n in nodes if n.node_id == i).score for i in r) for r in routes)
        assert plans[0].prior_tps == best


@settings(max_examples=200, deadline=None)
@given(networks(), st.data())
def test_the_candidate_cache_follows_any_topology_change_at_once_and_any_score_change(
    network, data
):
    num_layers, nodes = network
    ids = [node.node_id for node in nodes]
    gone = data.draw(st.sets(st.sampled_from(ids))) if ids else set()
    banned = frozenset(data.draw(st.sets(st.sampled_from(ids)))) if ids else frozenset()
    changed = [
        replace(node, queue_depth=data.draw(st.integers(min_value=0, max_value=3)))
        for node in nodes
        if node.node_id not in gone
    ]
    clock = ManualClock()
    cache = CandidateCache(clock=clock)
    first = cache.routes(model_key="m", num_layers=num_layers, nodes=nodes)

    plans = cache.routes(model_key="m", num_layers=num_layers, nodes=changed, avoid=banned)
    fresh = enumerate_routes(model_key="m", num_layers=num_layers, nodes=changed, avoid=banned)
    clock.advance(RESELECT_SECONDS)
    later = cache.routes(model_key="m", num_layers=num_layers, nodes=changed, avoid=banned)

    assert later == fresh
    if gone or banned:  # the topology changed: the candidates follow at once
        assert plans == fresh
    else:  # only scores: the same routes, with the current priors, ranked again
        assert sorted(plan.node_ids for plan in plans) == sorted(p.node_ids for p in first)
        by_id = {node.node_id: node for node in changed}
        for plan in plans:
            assert plan.prior_tps == min(by_id[n].score for n in plan.node_ids)
        keys = [
            (-plan.prior_tps, len(plan.hops), plan.token_seconds, plan.node_ids) for plan in plans
        ]
        assert keys == sorted(keys)


@settings(max_examples=200, deadline=None)
@given(networks())
def test_it_pins_any_enumerated_route_back_to_the_same_plan(network):
    num_layers, nodes = network
    online = {node.node_id: node for node in nodes}

    for plan in enumerate_routes(model_key="m", num_layers=num_layers, nodes=nodes):
        pinned = plan_pinned_route(
            model_key="m", num_layers=num_layers, node_ids=plan.node_ids, online=online
        )
        assert pinned == plan


arm_states = st.builds(
    ArmState,
    value=st.floats(min_value=0.1, max_value=1000.0),
    mass=st.floats(min_value=0.0, max_value=100.0),
    at=st.floats(min_value=0.0, max_value=10_000.0),
    epoch=st.integers(min_value=0, max_value=3),
    samples=st.integers(min_value=1, max_value=100),
)


@settings(max_examples=300, deadline=None)
@given(arm_states, arm_states)
def test_it_merges_two_trackers_states_the_same_way_round(first, second):
    one = first.merged(second, half_life=600.0)
    other = second.merged(first, half_life=600.0)

    assert one.value == pytest.approx(other.value)
    assert one.mass == pytest.approx(other.mass)
    assert (one.epoch, one.samples) == (other.epoch, other.samples)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(ArmStatus)),
            st.floats(min_value=0.1, max_value=500.0),
        ),
        min_size=1,
        max_size=8,
    ),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_it_expects_shares_that_sum_to_one_unless_every_route_is_held(arms, explore):
    plans = enumerate_routes(
        model_key="m",
        num_layers=2,
        nodes=[NodeRecord(f"n{i}", "http://n", 0, 1, benchmark_tps=1.0) for i in range(8)],
    )
    views = [
        ArmView(plan, status, tps, 1.0, 1) for plan, (status, tps) in zip(plans, arms, strict=False)
    ]

    policy = RoutePolicyConfig(policy=POLICY_ADR0021, explore_share=explore).route_policy()
    shares = policy.shares(views)

    kept_out = all(view.status is ArmStatus.QUARANTINED for view in views)
    assert sum(shares) == pytest.approx(0.0 if kept_out else 1.0)
    assert all(share >= 0 for share in shares)
