"""The candidate cache (ADR-0018): the enumeration's routes, selected again when the
topology changes at once and when scores change after the reselect interval."""

from __future__ import annotations

from dataclasses import replace

from routing_app.planning.cache import CandidateCache
from routing_app.planning.search import enumerate_routes
from tests.support.routing import ManualClock, record


def plans_for(nodes, **kwargs):
    """What the enumeration itself gives for ``nodes`` (the cache must agree)."""
    return enumerate_routes(model_key="qwen", num_layers=40, nodes=nodes, **kwargs)


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
