"""Route plans and candidate enumeration (ADR-0021), on plain node records.

A ``RoutePlan`` is the one value that both the proxy and the statistics see:
its head, its hops (with the layers each hop actually runs) and its signature
are all read from the same tuple of hops, and a plan that does not cover the
model's layers exactly once, in order, from layer 0, cannot be constructed.
That is what makes ADR-0020's bug (a head chosen apart from the plan, and a
downstream hop told to start at its own shard start) impossible.

Nothing here touches the database: ``routing_app.selectors`` turns node rows
into ``NodeRecord`` values, so benchmarks and simulators use the planner as is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshnet_site.errors import DomainError, ErrorKind

# At most this many candidate routes per model take part in the choice.
MAX_CANDIDATES = 8


class InvalidPinnedRoute(DomainError):
    """The client pinned a route that cannot serve the model (the message says why)."""

    kind = ErrorKind.INVALID
    code = "invalid_route"


class PinnedNodeUnavailable(DomainError):
    """The client pinned a node of the model that is not online now."""

    kind = ErrorKind.UNAVAILABLE
    code = "route_node_unavailable"


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
    layer exactly once, in order. ``signature`` is derived from the hops on
    every read and is never stored apart from them.
    """

    model_key: str
    last_layer: int
    hops: tuple[Hop, ...]
    prior_tps: float = 0.0

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

    @property
    def head(self) -> Hop:
        """The node that receives the request: it embeds, so it runs layer 0."""
        return self.hops[0]

    @property
    def signature(self) -> str:
        """``model_key | node[start-end] -> node[start-end] …``: the bandit arm's identity."""
        return f"{self.model_key} | " + " -> ".join(hop.label for hop in self.hops)

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(hop.node_id for hop in self.hops)

    def to_dict(self) -> list[dict[str, Any]]:
        """The hop list as it travels in JSON (``/v1/routing``, the chat ``meshnet`` field)."""
        return [hop.to_dict() for hop in self.hops]


def _route_prior(route: Sequence[NodeRecord]) -> float:
    """Bottleneck hop's queue-adjusted throughput times that hop's reputation."""
    return min(node.score for node in route)


def _best_by_start(nodes: Sequence[NodeRecord], num_layers: int) -> list[NodeRecord | None]:
    """For every layer, the node that can run from it and reaches furthest.

    ``nodes`` must be sorted by node id. Ties on reach go to the better score,
    then to the node seen first, so plans are deterministic. A prefix maximum
    over shard starts: the node with the greatest reach among those starting
    at or before a layer is the answer whenever its reach includes that layer
    (if it does not, no node's does).
    """
    starting: list[list[NodeRecord]] = [[] for _ in range(num_layers)]
    for node in nodes:
        if 0 <= node.shard_start < num_layers:
            starting[node.shard_start].append(node)
    best: list[NodeRecord | None] = [None] * num_layers
    leader: NodeRecord | None = None
    leader_key = (-1, 0.0)
    for layer in range(num_layers):
        for node in starting[layer]:
            key = (node.shard_end, node.score)
            if key > leader_key:
                leader, leader_key = node, key
        if leader is not None and leader.shard_end >= layer:
            best[layer] = leader
    return best


def enumerate_routes(
    *,
    model_key: str,
    num_layers: int,
    nodes: Iterable[NodeRecord],
    avoid: frozenset[str] = frozenset(),
    limit: int = MAX_CANDIDATES,
) -> list[RoutePlan]:
    """Candidate routes: one per distinct head, best prior first, at most ``limit``.

    A head is a node whose shard starts at layer 0. Each head is completed
    greedily: the next hop is the node that can run from the previous hop's
    end + 1 and reaches furthest (whatever its own shard start); a head that
    cannot reach the last layer yields no candidate. Nodes in ``avoid`` take
    no part. Equal priors rank the route with fewer hops first (ADR-0020: a
    fast partial head in front of a slow full node still runs every token
    through the slow node), then by head node id.
    """
    usable = sorted(
        (node for node in nodes if node.node_id not in avoid), key=lambda node: node.node_id
    )
    if num_layers < 1:
        return []
    last_layer = num_layers - 1
    best = _best_by_start(usable, num_layers)
    ranked: list[tuple[float, int, str, list[NodeRecord]]] = []
    for head in usable:
        if head.shard_start != 0:
            continue
        chain = [head]
        end = min(head.shard_end, last_layer)
        while end < last_layer:
            following = best[end + 1]
            if following is None:
                break
            chain.append(following)
            end = min(following.shard_end, last_layer)
        if end < last_layer:
            continue
        ranked.append((-_route_prior(chain), len(chain), head.node_id, chain))
    ranked.sort(key=lambda item: item[:3])
    return [_plan(model_key, last_layer, chain) for *_, chain in ranked[:limit]]


def _plan(model_key: str, last_layer: int, chain: Sequence[NodeRecord]) -> RoutePlan:
    hops: list[Hop] = []
    start = 0
    for node in chain:
        end = min(node.shard_end, last_layer)
        hops.append(Hop(node.node_id, node.endpoint, start, end))
        start = end + 1
    return RoutePlan(model_key, last_layer, tuple(hops), _route_prior(chain))


def plan_pinned_route(
    *,
    model_key: str,
    num_layers: int,
    node_ids: Sequence[str],
    online: Mapping[str, NodeRecord],
    known: Iterable[str] = (),
) -> RoutePlan:
    """The plan for a client-pinned list of node ids, or a ``DomainError`` saying why not.

    ``online`` holds the model's online nodes by id; ``known`` the ids of the
    model's nodes in any status (so an offline node raises
    ``PinnedNodeUnavailable``, an id the registry never saw
    ``InvalidPinnedRoute``). Hop 0 must start at layer 0; each later hop runs
    from the previous end + 1 to its own shard end and must hold that layer;
    the last hop must reach the model's last layer.
    """
    if not node_ids:
        raise InvalidPinnedRoute("The pinned route is empty: list at least one node id")
    if len(set(node_ids)) != len(node_ids):
        raise InvalidPinnedRoute("The pinned route lists a node more than once")
    known_ids = set(known) | set(online)
    chain: list[NodeRecord] = []
    for node_id in node_ids:
        node = online.get(node_id)
        if node is None:
            if node_id in known_ids:
                raise PinnedNodeUnavailable(f"Pinned node {node_id} is not online for {model_key}")
            raise InvalidPinnedRoute(f"Pinned node {node_id} is not a node of {model_key}")
        chain.append(node)
    last_layer = num_layers - 1
    start = 0
    for node in chain:
        if start > last_layer:
            raise InvalidPinnedRoute(
                f"Pinned node {node.node_id} comes after the route already reached the "
                f"last layer {last_layer}"
            )
        if not node.shard_start <= start <= node.shard_end:
            raise InvalidPinnedRoute(
                f"Pinned node {node.node_id} holds layers {node.shard_start}-"
                f"{node.shard_end} and cannot run from layer {start}"
            )
        start = min(node.shard_end, last_layer) + 1
    if start - 1 != last_layer:
        raise InvalidPinnedRoute(
            f"The pinned route ends at layer {start - 1}; {model_key} needs layers 0-{last_layer}"
        )
    return _plan(model_key, last_layer, chain)


def uncovered_layers(nodes: Sequence[NodeRecord], num_layers: int) -> list[tuple[int, int]]:
    """The layer ranges no node serves, as inclusive (first, last) pairs, in order."""
    covered = [False] * num_layers
    for node in nodes:
        for layer in range(max(0, node.shard_start), min(num_layers, node.shard_end + 1)):
            covered[layer] = True
    gaps: list[tuple[int, int]] = []
    for layer, served in enumerate(covered):
        if served:
            continue
        if gaps and gaps[-1][1] == layer - 1:
            gaps[-1] = (gaps[-1][0], layer)
        else:
            gaps.append((layer, layer))
    return gaps
