"""Routing simulator: the ADR-0021 bandit against round-robin and an all-knowing oracle.

Seeded, no network, no database. Two scenarios (ADR-0020's GPU head + CPU
full node, and a five-node mesh with four candidate routes) whose nodes' *true*
speed differs from the benchmark they advertise (the prior). Requests arrive
(Poisson, 1 per second), each generating 16-256 tokens; a route's true speed
is the inverse of the per-token time summed over its hops (layers run times
the node's per-layer time, plus 4 ms of network per hop after the head), and
every observed sample carries 10 % log-normal noise. Three events, at a
quarter, a half and three quarters of the run:

1. the fastest route's own costliest node slows down 5x (no epoch bump: the
   statistics must notice on their own);
2. a fast full-model node joins (topology epoch bump);
3. the fastest route's own node leaves (epoch bump).

For each policy it reports the throughput (tokens delivered ÷ generation
time) as a ratio of the oracle's, which always takes the truly fastest
candidate, and, after each event, how many requests were served before the
policy's expected traffic share on the new fastest route passed 50 %.

Run: ``.venv/bin/python bench/routing_sim.py [--seeds N] [--requests N]``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from routing_app.choice import choose_arm, policy_shares
from routing_app.config import RoutingConfig
from routing_app.planner import NodeRecord, RoutePlan, enumerate_routes
from routing_app.stats import RouteStatsStore

HOP_SECONDS = 0.004  # network time per token for every hop after the head
ARRIVALS_PER_SECOND = 1.0
NOISE_SIGMA = 0.10


@dataclass
class SimNode:
    """A node as the tracker sees it (``record``) and as it really is (``layer_seconds``)."""

    record: NodeRecord
    layer_seconds: float


def node(node_id: str, start: int, end: int, *, advertised: float, real: float) -> SimNode:
    """``advertised`` and ``real`` are tokens/s over the node's whole shard."""
    layers = end - start + 1
    record = NodeRecord(node_id, f"http://{node_id}", start, end, benchmark_tps=advertised)
    return SimNode(record, 1.0 / (real * layers))


@dataclass(frozen=True)
class Scenario:
    name: str
    num_layers: int
    nodes: tuple[SimNode, ...]
    joiner: SimNode


SCENARIOS = [
    Scenario(
        # ADR-0020's topology: a fast partial GPU head and a slow full CPU node.
        "ADR-0020 pair (GPU 0-21 + CPU 0-39, 40 layers)",
        40,
        (
            node("gpu-head", 0, 21, advertised=11164.0, real=100.0),
            node("cpu-full", 0, 39, advertised=425.0, real=20.0),
        ),
        node("new-full", 0, 39, advertised=300.0, real=40.0),
    ),
    Scenario(
        # Benchmarks that flatter some routes and undersell others.
        "five-node mesh (32 layers, 4 candidate routes)",
        32,
        (
            node("gpu-head", 0, 15, advertised=400.0, real=160.0),
            node("cpu-tail", 16, 31, advertised=30.0, real=45.0),
            node("cpu-full", 0, 31, advertised=25.0, real=18.0),
            node("old-full", 0, 31, advertised=20.0, real=12.0),
            node("mid-head", 0, 23, advertised=60.0, real=40.0),
        ),
        node("new-full", 0, 31, advertised=35.0, real=48.0),
    ),
]


@dataclass
class Network:
    scenario: Scenario
    nodes: dict[str, SimNode] = field(default_factory=dict)
    epoch: int = 1

    def __post_init__(self) -> None:
        self.nodes = {n.record.node_id: n for n in self.scenario.nodes}

    def candidates(self) -> list[RoutePlan]:
        return enumerate_routes(
            model_key="sim",
            num_layers=self.scenario.num_layers,
            nodes=[n.record for n in self.nodes.values()],
        )

    def true_tps(self, plan: RoutePlan) -> float:
        seconds = 0.0
        for index, hop in enumerate(plan.hops):
            layers = hop.end_layer - hop.start_layer + 1
            seconds += layers * self.nodes[hop.node_id].layer_seconds
            seconds += HOP_SECONDS if index else 0.0
        return 1.0 / seconds

    def fastest(self, plans: list[RoutePlan]) -> RoutePlan:
        return max(plans, key=self.true_tps)

    def victim(self, plans: list[RoutePlan]) -> str:
        """The fastest route's own node (in no other candidate) that costs it most time."""
        best = self.fastest(plans)
        shared = {n for plan in plans if plan is not best for n in plan.node_ids}
        own = [hop for hop in best.hops if hop.node_id not in shared] or list(best.hops)
        costliest = max(
            own,
            key=lambda hop: (
                (hop.end_layer - hop.start_layer + 1) * self.nodes[hop.node_id].layer_seconds
            ),
        )
        return costliest.node_id


Policy = Callable[[list[RoutePlan], RouteStatsStore, Network, random.Random], RoutePlan]


def bandit(config: RoutingConfig) -> Policy:
    def choose(
        plans: list[RoutePlan], store: RouteStatsStore, net: Network, rng: random.Random
    ) -> RoutePlan:
        picked = choose_arm(arms=store.views(plans=plans, epoch=net.epoch), config=config, rng=rng)
        assert picked is not None
        return picked[0].plan

    return choose


def round_robin() -> Policy:
    counter = itertools.count()

    def choose(
        plans: list[RoutePlan], store: RouteStatsStore, net: Network, rng: random.Random
    ) -> RoutePlan:
        return plans[next(counter) % len(plans)]

    return choose


def oracle(plans: list[RoutePlan], store: RouteStatsStore, net: Network, rng: random.Random):
    return net.fastest(plans)


def expected_share(
    name: str, config: RoutingConfig | None, plans, store, net: Network, target: str
) -> float:
    signatures = [plan.signature for plan in plans]
    if target not in signatures:
        return 0.0
    if name == "round-robin":
        return 1.0 / len(plans)
    if name == "oracle":
        return 1.0 if net.fastest(plans).signature == target else 0.0
    assert config is not None
    shares = policy_shares(arms=store.views(plans=plans, epoch=net.epoch), config=config)
    return shares[signatures.index(target)]


@dataclass
class RunResult:
    throughput: float
    to_majority: list[int | None]  # per event; None: not before the next event (or the end)
    settled: list[float]  # per event: share on the new best just before the next event


def simulate(
    scenario: Scenario,
    name: str,
    policy: Policy,
    config: RoutingConfig | None,
    seed: int,
    requests: int,
) -> RunResult:
    net = Network(scenario)
    now = [0.0]
    store = RouteStatsStore(half_life=600.0, min_sample_tokens=8, clock=lambda: now[0])
    arrivals, work, noise = random.Random(seed), random.Random(seed + 1), random.Random(seed + 2)
    rng = random.Random(seed + 3)
    event_at = {requests // 4: "slowdown", requests // 2: "join", 3 * requests // 4: "leave"}
    tokens_total = seconds_total = 0.0
    targets: list[str] = []
    to_majority: list[int | None] = []
    settled: list[float] = []
    began = 0
    plans = net.candidates()
    for request in range(requests + 1):
        event = event_at.get(request)
        if event is not None or request == requests:
            if targets:
                settled.append(expected_share(name, config, plans, store, net, targets[-1]))
            if request == requests:
                break
        if event is not None:
            victim = net.victim(plans)
            if event == "slowdown":
                slowed = net.nodes[victim]
                net.nodes[victim] = replace(slowed, layer_seconds=slowed.layer_seconds * 5)
            elif event == "join":
                net.nodes[scenario.joiner.record.node_id] = scenario.joiner
                net.epoch += 1
            else:
                del net.nodes[victim]
                net.epoch += 1
            plans = net.candidates()
            targets.append(net.fastest(plans).signature)
            to_majority.append(None)
            began = request
        if (
            targets
            and to_majority[-1] is None
            and expected_share(name, config, plans, store, net, targets[-1]) > 0.5
        ):
            to_majority[-1] = request - began
        now[0] += arrivals.expovariate(ARRIVALS_PER_SECOND)
        plan = policy(plans, store, net, rng)
        tokens = work.randint(16, 256)
        observed = net.true_tps(plan) * math.exp(noise.gauss(0.0, NOISE_SIGMA))
        tokens_total += tokens
        seconds_total += tokens / observed
        store.record_sample(
            model_key="sim",
            signature=plan.signature,
            epoch=net.epoch,
            output_tokens=tokens,
            tokens_per_second=observed,
        )
    return RunResult(tokens_total / seconds_total, to_majority, settled)


POLICIES: list[tuple[str, RoutingConfig | None]] = [
    ("ADR-0021 default (explore 0.3, alpha 1)", RoutingConfig()),
    ("ADR-0021 tuned (explore 0.1, alpha 2)", RoutingConfig(explore_share=0.1, weight_alpha=2.0)),
    ("round-robin", None),
    ("oracle", None),
]


def policy_for(name: str, config: RoutingConfig | None) -> Policy:
    if config is not None:
        return bandit(config)
    return round_robin() if name == "round-robin" else oracle


def describe(answers: list[int | None], settled: list[float]) -> str:
    share = f"{statistics.mean(settled):.0%}"
    reached = [answer for answer in answers if answer is not None]
    if len(reached) < len(answers):
        return f"never in {len(answers) - len(reached)}/{len(answers)} (settles {share})"
    return f"{statistics.median(reached):.0f} (max {max(reached)}; settles {share})"


def main() -> None:
    parser = argparse.ArgumentParser(description="ADR-0021 routing simulator")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    seeds = range(1, args.seeds + 1)
    quarter = args.requests // 4
    print(
        f"routing simulator: {args.seeds} seeds x {args.requests} requests; events at request "
        f"{quarter} (5x slowdown), {2 * quarter} (join), {3 * quarter} (leave)"
    )
    print("columns: mean tok/s, mean ratio to the oracle; per event, median requests served")
    print("until the policy's expected share on the new fastest route passed 50%")
    for scenario in SCENARIOS:
        print(f"\n== {scenario.name}")
        results = {
            name: [
                simulate(scenario, name, policy_for(name, config), config, seed, args.requests)
                for seed in seeds
            ]
            for name, config in POLICIES
        }
        oracle_tp = [run.throughput for run in results["oracle"]]
        for name, _ in POLICIES:
            runs = results[name]
            ratios = [run.throughput / best for run, best in zip(runs, oracle_tp, strict=True)]
            print(
                f"{name:40} {statistics.mean(run.throughput for run in runs):6.2f} tok/s "
                f"{statistics.mean(ratios):6.3f} x oracle"
            )
            for index, event in enumerate(("slowdown", "join", "leave")):
                answers = [run.to_majority[index] for run in runs]
                settled = [run.settled[index] for run in runs]
                print(f"    {event:9} {describe(answers, settled)}")


if __name__ == "__main__":
    main()
