"""The routing simulator's topologies and its all-routes oracle (bench/routing_simulation)."""

from __future__ import annotations

import random

from bench.routing_simulation.simulator import (
    ORACLE,
    Policy,
    RunResult,
    oracle,
    simulate,
)
from bench.routing_simulation.topologies import (
    BATCH_CAP,
    BATCH_EXPONENT,
    REPLICA_SCENARIOS,
    Network,
    Scenario,
    per_request,
)
from bench.routing_simulation.workload import Load
from routing_app.learning.stats import RouteStatsStore
from routing_app.planning.route_plan import RoutePlan

TWO_STAGES, THREE_STAGES, DEMO = REPLICA_SCENARIOS


def always(route: RoutePlan) -> Policy:
    def choose(
        plans: list[RoutePlan],
        store: RouteStatsStore,
        net: Network,
        load: Load,
        rng: random.Random | None,
    ) -> RoutePlan:
        return route

    return choose


def run(scenario: Scenario, name: str, policy: Policy, share: float, requests: int) -> RunResult:
    rate = share * per_request(Network(scenario).capacity_bound())
    return simulate(scenario, name, policy, None, 7, requests, rate)


def test_complete_routes_are_every_chain_of_replicas() -> None:
    counts = [len(Network(scenario).complete_routes()) for scenario in REPLICA_SCENARIOS]
    demo = {route.signature for route in Network(DEMO).complete_routes()}

    assert counts == [9, 27, 3]
    assert demo == {
        "sim | full[0-29]",
        "sim | head[0-14] -> tail[15-29]",
        "sim | head[0-14] -> full[15-29]",
    }


def test_every_planner_candidate_is_a_complete_route() -> None:
    for scenario in REPLICA_SCENARIOS:
        net = Network(scenario)
        complete = {route.signature for route in net.complete_routes()}

        assert {plan.signature for plan in net.candidates()} <= complete


def test_the_capacity_bound_is_the_bottleneck_stage_of_replicas() -> None:
    gain = BATCH_CAP**BATCH_EXPONENT
    heads, tails = 150 + 100 + 60, 130 + 90 + 50  # the replicas' true tokens/s per stage

    assert Network(TWO_STAGES).capacity_bound() == min(heads, tails) * gain


def test_a_loaded_pipeline_serves_at_its_bottleneck_node_not_the_sum_of_its_hops() -> None:
    net = Network(TWO_STAGES)
    route = next(r for r in net.complete_routes() if r.node_ids == ("head-a", "tail-c"))
    bottleneck = net.node_capacity("tail-c", 16)
    occupancy = net.occupancy([(route, 100)])

    served = 100 * net.session_tps(route, occupancy)

    assert 0.95 * bottleneck <= served <= bottleneck * 1.001


def test_the_all_routes_oracle_never_does_worse_than_the_best_single_route() -> None:
    routes = Network(TWO_STAGES).complete_routes()
    best_single = max(
        run(TWO_STAGES, "single", always(route), 0.3, 300).throughput for route in routes
    )

    assert run(TWO_STAGES, ORACLE, oracle, 0.3, 300).throughput >= best_single


def test_the_all_routes_oracle_uses_every_replica_under_load() -> None:
    for scenario in (TWO_STAGES, THREE_STAGES):
        result = run(scenario, ORACLE, oracle, 1.2, 400)
        sent = sum(result.routes.values())

        assert {node: result.nodes[node] / sent >= 0.05 for node in Network(scenario).nodes} == {
            node: True for node in Network(scenario).nodes
        }
        assert result.served >= 0.9 * Network(scenario).capacity_bound()


def test_the_all_routes_oracle_sends_the_demo_head_through_the_tail_and_the_full_node() -> None:
    result = run(DEMO, ORACLE, oracle, 0.9, 400)

    assert result.routes["sim | head[0-14] -> tail[15-29]"] > 0
    assert result.routes["sim | full[0-29]"] > 0
