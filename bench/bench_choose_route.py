"""How long one routing decision takes with 200 online nodes of one model.

One decision = the candidates from the node records (ADR-0018: a cover of
every node on a complete route, then the best priors, at most
``MAX_CANDIDATES``, read through the process's ``CandidateCache``) + read
their arms from the store + the configured policy's ``choose``, what
``services.route_choose`` does once it has read the registry; the database
read that produces the records is not included. Two networks: ``mixed`` (200
nodes of every shape, more heads than the cap, every candidate measured so
``thompson-load`` draws) and ``replicas`` (200 nodes, 4 heads and the rest
replicas of three later stages, so the cover is built by greedy set cover,
one candidate measured and the rest predicted from their nodes, ADR-0018).

Three cases per policy, in the same run: ``hit`` (the same records as the
last decision: the cached plans), ``rescored`` (the same topology, every
node's queue changed since the last decision: the kept routes planned and
ranked again, what a busy tracker sees between heartbeats) and ``miss``
(every decision enumerates: a topology change, or the routes selected again
after ``RESELECT_SECONDS``; this is also the decision before the cache).
Each is timed against a decision's 1 ms budget (ADR-0003), and hit and rescored
against miss, the three interleaved a decision each (so the machine's load
falls on all three alike). Standalone: ``.venv/bin/python bench/bench_choose_route.py``.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "meshnet_site.settings")

from routing_app.learning.stats import RouteStatsStore
from routing_app.planning.cache import CandidateCache
from routing_app.planning.route_plan import NodeRecord, RoutePlan
from routing_app.planning.search import MAX_CANDIDATES, enumerate_routes
from routing_app.policies.config import POLICY_ADR0021, POLICY_THOMPSON_LOAD, RoutePolicyConfig

NUM_LAYERS = 40
NODES = 200
BUDGET_SECONDS = 1e-3
ROUNDS = 2000


def network(rng: random.Random) -> list[NodeRecord]:
    """200 nodes: full-model nodes, heads of various lengths, middles and tails."""
    nodes = []
    for index in range(NODES):
        kind = index % 4
        if kind == 0:
            start, end = 0, NUM_LAYERS - 1
        elif kind == 1:
            start, end = 0, rng.randint(5, 30)
        elif kind == 2:
            start = rng.randint(5, 25)
            end = rng.randint(start, NUM_LAYERS - 1)
        else:
            start, end = rng.randint(15, 35), NUM_LAYERS - 1
        nodes.append(
            NodeRecord(
                node_id=f"node-{index:03}",
                endpoint=f"http://10.0.{index // 250}.{index % 250}:7000",
                shard_start=start,
                shard_end=end,
                benchmark_tps=rng.uniform(5.0, 500.0),
                queue_depth=rng.randint(0, 3),
                active_sessions=rng.randint(0, 2),
                reputation=rng.uniform(0.5, 1.0),
            )
        )
    return nodes


def replicas(rng: random.Random) -> list[NodeRecord]:
    """200 nodes: 4 heads (0-9) and replicas of three stages (10-19, 20-29, 30-39)."""
    nodes = []
    for index in range(NODES):
        start = 0 if index < 4 else 10 * (1 + index % 3)
        nodes.append(
            NodeRecord(
                node_id=f"node-{index:03}",
                endpoint=f"http://10.0.{index // 250}.{index % 250}:7000",
                shard_start=start,
                shard_end=start + 9,
                benchmark_tps=rng.uniform(5.0, 500.0),
                queue_depth=rng.randint(0, 3),
                reputation=rng.uniform(0.5, 1.0),
            )
        )
    return nodes


Candidates = Callable[[list[NodeRecord]], list[RoutePlan]]


def cached() -> Candidates:
    cache = CandidateCache(reselect_after=math.inf)
    return lambda nodes: cache.routes(model_key="bench", num_layers=NUM_LAYERS, nodes=nodes)


def uncached(nodes: list[NodeRecord]) -> list[RoutePlan]:
    return enumerate_routes(model_key="bench", num_layers=NUM_LAYERS, nodes=nodes)


class Case:
    """One way of getting the candidates, with its own store and policy, timed a decision
    at a time; the records are taken in turn (one list: the same every decision)."""

    def __init__(
        self,
        records: list[list[NodeRecord]],
        candidates: Candidates,
        config: RoutePolicyConfig,
        measured: int,
    ) -> None:
        self.records, self.candidates = records, candidates
        self.store = RouteStatsStore(half_life=600.0)
        self.rng = random.Random(1)
        # The first ``measured`` candidates proven, as on a tracker that served traffic.
        for plan in uncached(records[0])[:measured]:
            self.store.arms.record_sample(
                model_key="bench",
                signature=plan.signature,
                epoch=1,
                output_tokens=64,
                tokens_per_second=self.rng.uniform(10, 60),
            )
        self.policy = config.route_policy()
        candidates(records[-1])
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def decide(self, round_: int) -> None:
        """One decision, wall clock and this thread's CPU (what it costs when it has a
        core: the figure a busy shared machine inflates least)."""
        nodes = self.records[round_ % len(self.records)]
        began, began_cpu = time.perf_counter(), time.thread_time()
        plans = self.candidates(nodes)
        arms = self.store.views(plans=plans, epoch=1)
        picked = self.policy.choose(arms, rng=self.rng)
        self.wall.append(time.perf_counter() - began)
        self.cpu.append(time.thread_time() - began_cpu)
        assert picked is not None


def requeued(nodes: list[NodeRecord]) -> list[NodeRecord]:
    """The same nodes with one more request queued at each (every score changed)."""
    return [replace(node, queue_depth=node.queue_depth + 1) for node in nodes]


def main() -> None:
    print(f"choose_route, {NODES} online nodes, {NUM_LAYERS} layers, cap {MAX_CANDIDATES}")
    for name, nodes, measured in (
        ("mixed", network(random.Random(2026)), MAX_CANDIDATES),
        ("replicas", replicas(random.Random(2026)), 1),
    ):
        plans = uncached(nodes)
        covered = len({node_id for plan in plans for node_id in plan.node_ids})
        print(f"{name}: {len(plans)} candidates through {covered} nodes, {measured} measured")
        for policy in (POLICY_THOMPSON_LOAD, POLICY_ADR0021):
            config = RoutePolicyConfig(policy=policy)
            cases = {
                "miss": Case([nodes], uncached, config, measured),
                "hit": Case([nodes], cached(), config, measured),
                "rescored": Case([nodes, requeued(nodes)], cached(), config, measured),
            }
            for round_ in range(ROUNDS):  # interleaved: the machine's load falls on all three
                for case in cases.values():
                    case.decide(round_)
            medians = {name: statistics.median(case.wall) for name, case in cases.items()}
            for name, case in cases.items():
                median, cpu = medians[name], statistics.median(case.cpu)
                p95 = sorted(case.wall)[int(len(case.wall) * 0.95)]
                print(
                    f"  {policy:13} {name:8}: median {median * 1e6:7.1f} us   "
                    f"p95 {p95 * 1e6:7.1f} us   cpu median {cpu * 1e6:7.1f} us   "
                    f"median / 1 ms budget {median / BUDGET_SECONDS:.3f}"
                )
            print(
                f"  {policy:13} median / miss: hit {medians['hit'] / medians['miss']:.3f}, "
                f"rescored {medians['rescored'] / medians['miss']:.3f}"
            )


if __name__ == "__main__":
    main()
