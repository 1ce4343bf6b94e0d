"""The simulated topologies: nodes with an advertised and a true speed, and their network.

Five scenarios. Two with events (ADR-0020's GPU head + CPU full node, and a
five-node mesh), each with a node that joins mid-run. Three with replicas and
no events (``Scenario.joiner`` is None: the run is steady): three replicas per
stage over two stages and over three, at unequal speeds, and ``make demo``'s
mixed topology (a head 0-14, a tail 15-29 and a full node 0-29, SmolLM2's 30
layers).

A session's speed on a route is the inverse of its per-token time summed over
its hops: layers run × the node's per-layer time × the node's batching
slowdown, plus ``HOP_SECONDS`` of network per hop after the head. A session
has one token in flight, so it is at one of its nodes at a time: a node's
batch is its *occupancy*, the sessions whose token is there now, on average
(Little's law: each session in flight on the node, times the share of its
per-token time it spends there). The occupancies and the slowdowns they
cause are a fixed point (``Network.occupancy``). So a pipeline's stages work
at once, and a route's capacity under load is its bottleneck node's, not the
sum of its nodes' times.

``Network.complete_routes`` enumerates every complete route exhaustively, on
its own (not through the planner), so the oracle over them checks the
planner's candidates. ``Network.capacity_bound`` is the max-flow-like bound
the replica targets are measured against.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

from bench.routing_simulation.workload import PREFILL, TOKENS
from routing_app.planning.route_plan import Hop, NodeRecord, RoutePlan
from routing_app.planning.search import enumerate_routes

HOP_SECONDS = 0.004  # network time per token for every hop after the head
BATCH_EXPONENT = 0.4  # a node's aggregate throughput grows as k^0.4 ...
BATCH_CAP = 8  # ... up to this many sessions; beyond, the sessions share it
# The occupancy fixed point: iterations at most, and the change that ends them.
OCCUPANCY_ROUNDS = 30
OCCUPANCY_TOLERANCE = 0.01
MODEL_KEY = "sim"


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
    joiner: SimNode | None  # None: no events, a steady run (the replica topologies)
    short: str = ""  # the name in the report's summary lines


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
        "pair",
    ),
    Scenario(
        # Benchmarks that flatter some routes and undersell others.
        "five-node mesh (32 layers, 11 complete routes)",
        32,
        (
            node("gpu-head", 0, 15, advertised=400.0, real=160.0),
            node("cpu-tail", 16, 31, advertised=30.0, real=45.0),
            node("cpu-full", 0, 31, advertised=25.0, real=18.0),
            node("old-full", 0, 31, advertised=20.0, real=12.0),
            node("mid-head", 0, 23, advertised=60.0, real=40.0),
        ),
        node("new-full", 0, 31, advertised=35.0, real=48.0),
        "mesh",
    ),
]

# Replicas at several stages: no events, unequal speeds, benchmarks a little off.
REPLICA_SCENARIOS = [
    Scenario(
        "3 replicas x 2 stages (0-15, 16-31; 32 layers, 9 complete routes)",
        32,
        (
            node("head-a", 0, 15, advertised=120.0, real=150.0),
            node("head-b", 0, 15, advertised=130.0, real=100.0),
            node("head-c", 0, 15, advertised=50.0, real=60.0),
            node("tail-a", 16, 31, advertised=100.0, real=130.0),
            node("tail-b", 16, 31, advertised=90.0, real=90.0),
            node("tail-c", 16, 31, advertised=70.0, real=50.0),
        ),
        None,
        "3x2",
    ),
    Scenario(
        "3 replicas x 3 stages (0-9, 10-19, 20-29; 30 layers, 27 complete routes)",
        30,
        (
            node("first-a", 0, 9, advertised=200.0, real=240.0),
            node("first-b", 0, 9, advertised=150.0, real=150.0),
            node("first-c", 0, 9, advertised=120.0, real=90.0),
            node("middle-a", 10, 19, advertised=180.0, real=210.0),
            node("middle-b", 10, 19, advertised=140.0, real=120.0),
            node("middle-c", 10, 19, advertised=60.0, real=80.0),
            node("last-a", 20, 29, advertised=160.0, real=200.0),
            node("last-b", 20, 29, advertised=160.0, real=130.0),
            node("last-c", 20, 29, advertised=100.0, real=100.0),
        ),
        None,
        "3x3",
    ),
    Scenario(
        # make demo (ADR-0020): SmolLM2's 30 layers on a head, a tail and a full node.
        "demo mixed (head 0-14, tail 15-29, full 0-29; 3 complete routes)",
        30,
        (
            node("head", 0, 14, advertised=140.0, real=120.0),
            node("tail", 15, 29, advertised=110.0, real=100.0),
            node("full", 0, 29, advertised=60.0, real=55.0),
        ),
        None,
        "demo",
    ),
]


def batch_slowdown(sessions: float) -> float:
    """How much slower one session's step runs on a node with ``sessions`` at it at once."""
    k = max(sessions, 1.0)
    if k <= BATCH_CAP:
        return float(k ** (1.0 - BATCH_EXPONENT))
    return BATCH_CAP ** (1.0 - BATCH_EXPONENT) * k / BATCH_CAP


def layers_run(hop: Hop) -> int:
    return hop.end_layer - hop.start_layer + 1


@dataclass
class Network:
    scenario: Scenario
    nodes: dict[str, SimNode] = field(default_factory=dict)
    epoch: int = 1
    # The last occupancy solved: the next solve starts from it (one session changed).
    last_occupancy: dict[str, float] = field(default_factory=dict)
    routes_cache: tuple[frozenset[str], list[RoutePlan]] | None = None
    # By id(plan), the plan itself beside what ``profile`` derives from it.
    profiles: dict[int, tuple[RoutePlan, tuple[str, ...], tuple[float, ...], float]] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        self.nodes = {n.record.node_id: n for n in self.scenario.nodes}

    def candidates(self) -> list[RoutePlan]:
        """The planner's candidates: what the policies choose among."""
        return enumerate_routes(
            model_key=MODEL_KEY,
            num_layers=self.scenario.num_layers,
            nodes=[n.record for n in self.nodes.values()],
        )

    def complete_routes(self) -> list[RoutePlan]:
        """Every complete route over the online nodes, by exhaustive search (not the planner).

        A route is a chain of distinct nodes: the first holds layer 0, each
        next one holds the layer after the previous one's shard end and runs
        from there to its own shard end (the hop rule of a pinned route), and
        the last reaches the model's last layer.
        """
        key = frozenset(self.nodes)
        if self.routes_cache is not None and self.routes_cache[0] == key:
            return self.routes_cache[1]
        last = self.scenario.num_layers - 1
        records = sorted((n.record for n in self.nodes.values()), key=lambda r: r.node_id)
        routes: list[RoutePlan] = []

        def extend(hops: tuple[Hop, ...], start: int) -> None:
            if start > last:
                routes.append(RoutePlan(MODEL_KEY, last, hops))
                return
            used = {hop.node_id for hop in hops}
            for record in records:
                if record.node_id in used or not record.shard_start <= start <= record.shard_end:
                    continue
                end = min(record.shard_end, last)
                extend((*hops, Hop(record.node_id, record.endpoint, start, end)), end + 1)

        extend((), 0)
        self.routes_cache = (key, routes)
        return routes

    def set_node(self, node_id: str, sim_node: SimNode | None) -> None:
        """A node changes speed, joins (``sim_node``) or leaves (None)."""
        if sim_node is None:
            del self.nodes[node_id]
        else:
            self.nodes[node_id] = sim_node
        self.profiles.clear()

    def profile(self, plan: RoutePlan) -> tuple[tuple[str, ...], tuple[float, ...], float]:
        """``plan``'s node ids, each hop's seconds per token alone, and its network seconds."""
        entry = self.profiles.get(id(plan))
        if entry is None or entry[0] is not plan:
            alone = tuple(
                layers_run(hop) * self.nodes[hop.node_id].layer_seconds for hop in plan.hops
            )
            entry = (plan, plan.node_ids, alone, HOP_SECONDS * (len(plan.hops) - 1))
            self.profiles[id(plan)] = entry
        return entry[1], entry[2], entry[3]

    def hop_seconds(self, plan: RoutePlan, occupancy: Mapping[str, float]) -> list[float]:
        """Per hop, one token's time at the node (not the network) with ``occupancy``."""
        ids, alone, _ = self.profile(plan)
        return [
            seconds * batch_slowdown(occupancy.get(node_id, 0.0))
            for node_id, seconds in zip(ids, alone, strict=True)
        ]

    def token_seconds(self, plan: RoutePlan, occupancy: Mapping[str, float]) -> float:
        return sum(self.hop_seconds(plan, occupancy)) + self.profile(plan)[2]

    def occupancy(self, in_flight: Iterable[tuple[RoutePlan, int]]) -> dict[str, float]:
        """Sessions at each node at once, on average, with ``in_flight`` sessions per route.

        A fixed point: each session adds to a node the share of its per-token
        time it spends there, and that share depends on the slowdowns the
        occupancies cause. Iterated from the last solution (the map is
        monotone, so it settles) until no node moves by the tolerance.
        """
        flows = [(*self.profile(plan), count) for plan, count in in_flight]
        occupancy = {n: k for n, k in self.last_occupancy.items() if n in self.nodes}
        for _ in range(OCCUPANCY_ROUNDS):
            solved: dict[str, float] = {}
            for ids, alone, network, count in flows:
                seconds = [
                    at * batch_slowdown(occupancy.get(node_id, 0.0))
                    for node_id, at in zip(ids, alone, strict=True)
                ]
                share = count / (sum(seconds) + network)
                for node_id, at in zip(ids, seconds, strict=True):
                    solved[node_id] = solved.get(node_id, 0.0) + at * share
            moved = max(
                (abs(solved.get(n, 0.0) - occupancy.get(n, 0.0)) for n in solved | occupancy),
                default=0.0,
            )
            occupancy = solved
            if moved < OCCUPANCY_TOLERANCE:
                break
        self.last_occupancy = occupancy
        return occupancy

    def session_tps(self, plan: RoutePlan, occupancy: Mapping[str, float] | None = None) -> float:
        """Tokens/s of one session on ``plan`` at ``occupancy`` (None: alone)."""
        return 1.0 / self.token_seconds(plan, occupancy or {})

    def joining_tps(self, plan: RoutePlan, occupancy: Mapping[str, float]) -> float:
        """Tokens/s a new session on ``plan`` would run at: the nodes' occupancy plus its
        own share of time at each (one step of the fixed point; the others' slowdown
        it causes is not counted)."""
        seconds = self.hop_seconds(plan, occupancy)
        total = sum(seconds) + self.profile(plan)[2]
        joined = dict(occupancy)
        for hop, at in zip(plan.hops, seconds, strict=True):
            joined[hop.node_id] = joined.get(hop.node_id, 0.0) + at / total
        return self.session_tps(plan, joined)

    def fastest(self, plans: list[RoutePlan]) -> RoutePlan:
        return max(plans, key=self.session_tps)

    def victim(self, plans: list[RoutePlan]) -> str:
        """The fastest route's own node (in no other candidate) that costs it most time."""
        best = self.fastest(plans)
        shared = {n for plan in plans if plan is not best for n in plan.node_ids}
        own = [hop for hop in best.hops if hop.node_id not in shared] or list(best.hops)
        costliest = max(
            own, key=lambda hop: layers_run(hop) * self.nodes[hop.node_id].layer_seconds
        )
        return costliest.node_id

    def node_capacity(self, node_id: str, layers: int) -> float:
        """Tokens/s ``node_id`` serves running ``layers`` layers per token, at its batching
        cap (every session's token there: the most it can do)."""
        return BATCH_CAP**BATCH_EXPONENT / (layers * self.nodes[node_id].layer_seconds)

    def capacity_bound(self) -> float:
        """Tokens/s the topology can serve at most: a max-flow-like bound.

        The layers are cut into stages where the set of nodes holding them
        changes; a stage's capacity is the sum of its nodes' capacities, each
        running only that stage's layers; the topology's is the bottleneck
        stage's. With replicas over the same stages this is exact (any
        replica of a stage can follow any of the previous one); a node
        spanning several stages is counted in each, so the bound is then
        an upper bound.
        """
        last = self.scenario.num_layers - 1
        cuts = {0, last + 1}
        for n in self.nodes.values():
            cuts.update({max(0, n.record.shard_start), min(last, n.record.shard_end) + 1})
        edges = sorted(c for c in cuts if 0 <= c <= last + 1)
        stages = []
        for first, after in pairwise(edges):
            holders = [
                node_id
                for node_id, n in self.nodes.items()
                if n.record.shard_start <= first and after - 1 <= n.record.shard_end
            ]
            stages.append(sum(self.node_capacity(h, after - first) for h in holders))
        return min(stages)

    def capacity_rps(self) -> float:
        """Requests/s the event runs' load levels are shares of (the estimate ADR-0011's
        runs used, kept so their arrival rates stay as they were): node-disjoint
        candidates, fastest first, each at its speed alone times the batching gain at
        the cap."""
        used: set[str] = set()
        tokens_per_second = 0.0
        for plan in sorted(self.candidates(), key=self.session_tps, reverse=True):
            if used.intersection(plan.node_ids):
                continue
            used.update(plan.node_ids)
            tokens_per_second += self.session_tps(plan) * BATCH_CAP**BATCH_EXPONENT
        return per_request(tokens_per_second)


def per_request(tokens_per_second: float) -> float:
    """Requests/s from decode steps/s: a request's mean tokens plus its mean prefill."""
    return tokens_per_second / (sum(TOKENS) / 2 + sum(PREFILL) / 2)
