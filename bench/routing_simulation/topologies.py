"""The simulated topologies: nodes with an advertised and a true speed, and their network.

Two scenarios (ADR-0020's GPU head + CPU full node, and a five-node mesh with
four candidate routes), each with a node that joins mid-run. A session's
speed on a route is the inverse of its per-token time summed over its hops:
layers run × the node's per-layer time × the node's batching slowdown, plus
``HOP_SECONDS`` of network per hop after the head.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from routing_simulation.workload import PREFILL, TOKENS

from routing_app.planner import NodeRecord, RoutePlan, enumerate_routes

HOP_SECONDS = 0.004  # network time per token for every hop after the head
BATCH_EXPONENT = 0.4  # a node's aggregate throughput grows as k^0.4 ...
BATCH_CAP = 8  # ... up to this many sessions; beyond, the sessions share it


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


def batch_slowdown(sessions: int) -> float:
    """How much slower one session's step runs on a node serving ``sessions`` at once."""
    k = max(sessions, 1)
    if k <= BATCH_CAP:
        return float(k ** (1.0 - BATCH_EXPONENT))
    return BATCH_CAP ** (1.0 - BATCH_EXPONENT) * k / BATCH_CAP


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

    def session_tps(self, plan: RoutePlan, sessions: Counter[str] | None = None) -> float:
        """Tokens/s of one session on ``plan`` with ``sessions`` per node (None: alone)."""
        seconds = 0.0
        for index, hop in enumerate(plan.hops):
            layers = hop.end_layer - hop.start_layer + 1
            load = 1 if sessions is None else sessions[hop.node_id]
            seconds += layers * self.nodes[hop.node_id].layer_seconds * batch_slowdown(load)
            seconds += HOP_SECONDS if index else 0.0
        return 1.0 / seconds

    def fastest(self, plans: list[RoutePlan]) -> RoutePlan:
        return max(plans, key=self.session_tps)

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

    def capacity_rps(self) -> float:
        """Requests/s the topology sustains, roughly: node-disjoint routes, fastest first,
        each at its batching cap."""
        used: set[str] = set()
        tokens_per_second = 0.0
        for plan in sorted(self.candidates(), key=self.session_tps, reverse=True):
            if used.intersection(plan.node_ids):
                continue
            used.update(plan.node_ids)
            tokens_per_second += self.session_tps(plan) * BATCH_CAP**BATCH_EXPONENT
        return tokens_per_second / (sum(TOKENS) / 2 + sum(PREFILL) / 2)
