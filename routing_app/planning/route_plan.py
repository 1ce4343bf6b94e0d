"""Route plans: the one value that both the proxy and the statistics see (ADR-0003, ADR-0020).

A ``RoutePlan``'s head, its hops (with the layers each hop actually runs) and
its signature are all read from the same tuple of hops, and a plan that does
not cover the model's layers exactly once, in order, from layer 0, cannot be
constructed. That is what makes ADR-0020's bug (a head chosen apart from the
plan, and a downstream hop told to start at its own shard start) impossible.

Plans are built from ``NodeRecord`` values, never from rows, so benchmarks
and simulators use them as they are; ``plan_rank`` is the order candidates
are listed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What routing needs to know about one online node serving a shard."""

    node_id: str
    endpoint: str
    shard_start: int
    shard_end: int
    benchmark_tps: float = 0.0
    measured_tps: float = 0.0
    queue_depth: int = 0
    active_sessions: int = 0
    reputation: float = 1.0

    @property
    def effective_tps(self) -> float:
        """Queue-adjusted throughput: what a new request can expect from this node.

        The start-up benchmark the node advertised is a prior: once a
        measurement exists (the heartbeat's tokens/s) it is capped by it, so a
        node cannot claim more than it shows (ADR-0008). Shared with
        everything the node already runs or queues.
        """
        base = self.benchmark_tps
        if self.measured_tps > 0:
            base = min(base, self.measured_tps) if base > 0 else self.measured_tps
        return base / (1 + self.queue_depth + self.active_sessions)

    @property
    def score(self) -> float:
        """Effective throughput scaled by the tracker's trust in the node."""
        return self.effective_tps * self.reputation


@dataclass(frozen=True, slots=True)
class Hop:
    """One node of a route and the layers it runs (not necessarily its whole shard)."""

    node_id: str
    endpoint: str
    start_layer: int
    end_layer: int

    @property
    def label(self) -> str:
        return f"{self.node_id}[{self.start_layer}-{self.end_layer}]"

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "endpoint": self.endpoint,
            "start_layer": self.start_layer,
            "end_layer": self.end_layer,
        }


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """A complete route for one model: the proxy sends the request to ``head``.

    Construction checks that hop 0 starts at layer 0, that each later hop
    starts at the previous hop's end + 1 and that the last hop ends at
    ``last_layer``; a plan that exists is therefore a route that runs every
    layer exactly once, in order. ``signature`` is derived from the hops when
    the plan is built (it is read many times per decision) and is never stored
    apart from them.
    """

    model_key: str
    last_layer: int
    hops: tuple[Hop, ...]
    prior_tps: float = 0.0
    # Per hop: the seconds per token per layer its node's record implies (1 / (score ×
    # shard layers); inf for a node with no score): what ADR-0018's route priors read.
    layer_seconds: tuple[float, ...] = field(default=(), compare=False)
    _signature: str = field(init=False, repr=False, compare=False)
    _node_ids: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.hops:
            raise ValueError("a route has at least one hop")
        expected = 0
        seen: set[str] = set()
        for hop in self.hops:
            if hop.start_layer != expected:
                raise ValueError(
                    f"hop {hop.node_id} must start at layer {expected}, not {hop.start_layer}"
                )
            if hop.end_layer < hop.start_layer:
                raise ValueError(f"hop {hop.node_id} ends before it starts")
            if hop.node_id in seen:
                raise ValueError(f"node {hop.node_id} appears twice in one route")
            seen.add(hop.node_id)
            expected = hop.end_layer + 1
        if expected - 1 != self.last_layer:
            raise ValueError(
                f"the route ends at layer {expected - 1}, the model's last layer is "
                f"{self.last_layer}"
            )
        signature = f"{self.model_key} | " + " -> ".join(hop.label for hop in self.hops)
        object.__setattr__(self, "_signature", signature)
        object.__setattr__(self, "_node_ids", tuple(hop.node_id for hop in self.hops))

    @property
    def head(self) -> Hop:
        """The node that receives the request: it embeds, so it runs layer 0."""
        return self.hops[0]

    @property
    def signature(self) -> str:
        """``model_key | node[start-end] -> node[start-end] …``: the bandit arm's identity."""
        return self._signature

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self._node_ids

    @property
    def hop_seconds(self) -> tuple[float, ...]:
        """Each hop's predicted time per token (its layers × seconds per layer); empty for
        a plan built without its nodes' records."""
        return tuple(
            seconds * (hop.end_layer - hop.start_layer + 1)
            for hop, seconds in zip(self.hops, self.layer_seconds, strict=False)
        )

    @property
    def token_seconds(self) -> float:
        """One token's predicted time along the whole route (a token runs through every
        hop in turn); inf when a record says nothing."""
        times = self.hop_seconds
        return sum(times) if times and len(times) == len(self.hops) else math.inf

    def to_dict(self) -> list[dict[str, Any]]:
        """The hop list as it travels in JSON (``/v1/routing``, the chat ``meshnet`` field)."""
        return [hop.to_dict() for hop in self.hops]


def plan_from_records(model_key: str, last_layer: int, chain: Sequence[NodeRecord]) -> RoutePlan:
    """The plan that runs ``chain`` in order, each hop from the previous end + 1 to its own
    shard end (capped at ``last_layer``), with the prior its records imply."""
    hops: list[Hop] = []
    start = 0
    for node in chain:
        end = min(node.shard_end, last_layer)
        hops.append(Hop(node.node_id, node.endpoint, start, end))
        start = end + 1
    return RoutePlan(model_key, last_layer, tuple(hops), *_prior_and_seconds(chain))


def _prior_and_seconds(chain: Sequence[NodeRecord]) -> tuple[float, tuple[float, ...]]:
    """A route's prior (its bottleneck hop's score: queue-adjusted throughput times
    reputation) and, per hop, its node's seconds per token per layer."""
    scores = [node.score for node in chain]
    seconds = tuple(
        1.0 / (score * (node.shard_end - node.shard_start + 1)) if score > 0 else math.inf
        for node, score in zip(chain, scores, strict=True)
    )
    return min(scores), seconds


def plan_rescored(plan: RoutePlan, chain: Sequence[NodeRecord]) -> RoutePlan:
    """``plan`` with the prior and per-hop seconds of ``chain``'s current records.

    The hops, and so the checks and the signature, are those of ``plan``, which was
    built (and checked) by ``RoutePlan``'s constructor: they are copied, not redone.
    """
    prior, seconds = _prior_and_seconds(chain)
    rescored = object.__new__(RoutePlan)
    for name in RoutePlan.__slots__:
        object.__setattr__(rescored, name, getattr(plan, name))
    object.__setattr__(rescored, "prior_tps", prior)
    object.__setattr__(rescored, "layer_seconds", seconds)
    return rescored


def plan_rank(plan: RoutePlan) -> tuple[float, int, float, tuple[str, ...]]:
    """Candidates rank best prior first, then fewer hops (ADR-0020), then the faster
    token (two routes through one bottleneck: the faster other hops), then node ids."""
    return (-plan.prior_tps, len(plan.hops), plan.token_seconds, plan.node_ids)
