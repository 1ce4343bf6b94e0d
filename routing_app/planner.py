"""Route plans and candidate enumeration (ADR-0021, amended by ADR-0018), on plain node records.

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

import bisect
import heapq
import itertools
import math
import operator
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from meshnet_site.errors import DomainError, ErrorKind

# At most this many candidate routes per model take part in the choice (ADR-0018): a
# cover of every node that lies on a complete route first, then the best priors.
MAX_CANDIDATES = 16
# The best-first search for the best-prior routes expands at most this many partial
# routes per candidate asked for.
EXPANSIONS_PER_CANDIDATE = 4
# A model's candidate routes are selected again at most this often while its topology
# (nodes, endpoints, shards, nodes avoided) stays the same (ADR-0018, "The cache"):
# between selections the routes are kept and only their priors and rank follow the
# nodes' current scores.
RESELECT_SECONDS = 1.0


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


class _Node(NamedTuple):
    """A usable node as the enumeration reads it: its record, the layers it runs of the
    model, the position after its last one (where the next hop starts), its score."""

    record: NodeRecord
    start: int
    end: int
    after: int
    score: float


_Chain = tuple[_Node, ...]
# A (partial) route's rank, smaller is better: (-nodes it would newly cover, -bottleneck
# score, hops). Joining two parts adds the first and last, takes the larger second.
_Rank = tuple[int, float, int]
_EMPTY: _Rank = (0, -math.inf, 0)


def _ids(chain: Sequence[_Node]) -> tuple[str, ...]:
    return tuple(node.record.node_id for node in chain)


def enumerate_routes(
    *,
    model_key: str,
    num_layers: int,
    nodes: Iterable[NodeRecord],
    avoid: frozenset[str] = frozenset(),
    limit: int = MAX_CANDIDATES,
) -> list[RoutePlan]:
    """Candidate routes: distinct complete routes, best prior first, at most ``limit``.

    A route starts at a head (a node whose shard starts at layer 0); each next hop is
    any node holding the layer after the previous hop's last one and runs from there
    to its own shard end (ADR-0018). The candidates are first a *cover*: routes such
    that every node lying on some complete route is on one of them (downstream
    replicas and overlapping shards included) whenever ``limit`` routes can do it;
    then the best-prior routes not already in, up to ``limit``. Ranked by prior, then
    fewer hops (ADR-0020: a fast partial head in front of a slow full node still runs
    every token through the slow node), then the faster token (``token_seconds``), then
    node ids. Nodes in ``avoid`` take no part.
    """
    if num_layers < 1 or limit < 1:
        return []
    last_layer = num_layers - 1
    usable: list[_Node] = []
    for node in sorted(nodes, key=lambda node: node.node_id):
        end = min(node.shard_end, last_layer)
        if node.node_id not in avoid and 0 <= node.shard_start <= end:
            usable.append(_Node(node, node.shard_start, end, end + 1, node.score))
    chosen = {_ids(chain): chain for chain in _cover(usable, num_layers, limit)}
    if chosen and len(chosen) < limit:
        for chain in _best_routes(usable, num_layers, limit):
            chosen.setdefault(_ids(chain), chain)
            if len(chosen) >= limit:
                break
    plans = [
        _plan(model_key, last_layer, [node.record for node in chain]) for chain in chosen.values()
    ]
    return sorted(plans, key=_plan_order)


class _Selection(NamedTuple):
    """One topology's candidates: the routes selected at ``selected_at``, planned for
    the nodes' score inputs ``scores`` (in node id order)."""

    selected_at: float
    # Whether ``plans`` are the enumeration's for ``scores`` (not kept routes rescored).
    exact: bool
    scores: tuple[tuple[float, float, int, int, float], ...]
    plans: tuple[RoutePlan, ...]


class CandidateCache:
    """``enumerate_routes`` for repeated decisions: the routes are selected again only
    when the topology changes or ``reselect_after`` seconds have passed (ADR-0018).

    The key is what makes a route possible: the model, its layers, the cap, the nodes
    avoided and every usable node's id, endpoint and shard. A node joining, leaving,
    moving its shard or being avoided (banned) is a new key, so the candidates follow
    at once. Node scores (queue depth, measured speed, reputation) change with every
    heartbeat and do not select the routes again before ``reselect_after``: the kept
    routes are planned with the current records (prior, per-hop seconds) and ranked
    again, best prior first; with the same scores the plans themselves are reused.
    Safe to share between threads.
    """

    def __init__(
        self,
        *,
        reselect_after: float = RESELECT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        size: int = 64,
    ) -> None:
        self.reselect_after = reselect_after
        self.clock = clock
        self.size = size
        self._selections: dict[tuple[Any, ...], _Selection] = {}
        self._lock = threading.Lock()

    def routes(
        self,
        *,
        model_key: str,
        num_layers: int,
        nodes: Iterable[NodeRecord],
        avoid: frozenset[str] = frozenset(),
        limit: int = MAX_CANDIDATES,
    ) -> list[RoutePlan]:
        """What ``enumerate_routes`` gives for these arguments, from the cache when the
        topology is the one last seen and its routes were selected recently."""
        records = sorted(nodes, key=_RECORD_ID)
        if avoid:  # bans of other models' nodes change nothing here
            avoid = avoid.intersection(map(_RECORD_ID, records))
        key = (model_key, num_layers, limit, avoid, tuple(map(_RECORD_SHAPE, records)))
        scores = tuple(map(_RECORD_SCORE, records))
        now = self.clock()
        with self._lock:
            kept = self._selections.get(key)
        fresh = kept is not None and now - kept.selected_at < self.reselect_after
        if kept is not None and kept.scores == scores and (fresh or kept.exact):
            return list(kept.plans)
        if kept is not None and fresh:
            by_id = {node.node_id: node for node in records}
            plans = sorted(
                (_rescored(plan, [by_id[i] for i in plan.node_ids]) for plan in kept.plans),
                key=_plan_order,
            )
            selection = kept._replace(exact=False, scores=scores, plans=tuple(plans))
        else:
            plans = enumerate_routes(
                model_key=model_key, num_layers=num_layers, nodes=records, avoid=avoid, limit=limit
            )
            selection = _Selection(now, True, scores, tuple(plans))
        with self._lock:
            self._selections.pop(key, None)
            self._selections[key] = selection
            while len(self._selections) > self.size:
                del self._selections[next(iter(self._selections))]
        return plans


# What a record's place in routes depends on, and what its score is computed from.
_RECORD_ID = operator.attrgetter("node_id")
_RECORD_SHAPE = operator.attrgetter("node_id", "endpoint", "shard_start", "shard_end")
_RECORD_SCORE = operator.attrgetter(
    "benchmark_tps", "measured_tps", "queue_depth", "active_sessions", "reputation"
)


def _rescored(plan: RoutePlan, chain: Sequence[NodeRecord]) -> RoutePlan:
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


def _plan_order(plan: RoutePlan) -> tuple[float, int, float, tuple[str, ...]]:
    """Candidates rank best prior first, then fewer hops (ADR-0020), then the faster
    token (two routes through one bottleneck: the faster other hops), then node ids."""
    return (-plan.prior_tps, len(plan.hops), plan.token_seconds, plan.node_ids)


def _cover(usable: Sequence[_Node], num_layers: int, limit: int) -> list[_Chain]:
    """At most ``limit`` distinct routes covering the nodes that lie on a complete route.

    First the best route through each such node (one forward and one backward pass).
    If those are more than ``limit``, and no more than ``limit`` of the nodes end at
    the same layer (no two of them can share a route), greedy set cover instead: the
    best route of all, then each next the one with the most nodes not yet covered,
    then the best rank (one forward pass each). When even that needs more than
    ``limit`` routes, the best routes through nodes are kept, best first.
    """
    through, route_through = _through_routes(usable, num_layers)
    routes: dict[tuple[str, ...], _Chain] = {}
    for i in through:
        chain = route_through(i)
        routes.setdefault(_ids(chain), chain)
        if len(routes) > limit:
            break
    if len(routes) <= limit:
        return list(routes.values())
    on_routes = {id(usable[i]) for i in through}
    # No route holds two nodes that end at the same layer (after the first, the next
    # hop starts past the second's end): the largest such group needs as many routes.
    ending = Counter(usable[i].end for i in through)
    if max(ending.values()) <= limit:
        greedy = [next(iter(routes.values()))]  # the best route of all stays first
        first = {id(node) for node in greedy[0]}
        gains = [1 if id(node) in on_routes - first else 0 for node in usable]
        while any(gains) and len(greedy) < limit:
            prefix, entry = _forward(usable, num_layers, gains)
            chain = _chain_back(usable, prefix, entry, num_layers)
            greedy.append(chain)
            covered = {id(node) for node in chain}
            gains = [
                0 if id(node) in covered else gain for node, gain in zip(usable, gains, strict=True)
            ]
        if not any(gains):
            return greedy
    return list(routes.values())[:limit]


def _forward(
    usable: Sequence[_Node], num_layers: int, gains: Sequence[int] | None = None
) -> tuple[dict[int, tuple[_Rank, int]], dict[int, int]]:
    """Per reached position, the best prefix's rank and last hop (-1 for none), and per
    node index, the position its best prefix in front of it reaches.

    Positions are the layers a hop can start from: 0 and every node's end + 1
    (``num_layers``: the end of the model). O(n log n) for n nodes: reached positions
    are kept on a stack of increasing rank, so the best prefix reaching a layer at or
    after a node's shard start is the first on the stack at or after it.
    """
    prefix: dict[int, tuple[_Rank, int]] = {0: (_EMPTY, -1)}
    stack: list[int] = []  # positions, increasing; their ranks increase too
    pending = [0]  # reached positions not yet on the stack, increasing
    entry: dict[int, int] = {}
    afters = [node.after for node in usable]
    for i in sorted(range(len(usable)), key=afters.__getitem__):
        node = usable[i]
        while pending and pending[0] < node.after:
            position = pending.pop(0)
            rank = prefix[position][0]
            while stack and prefix[stack[-1]][0] >= rank:
                stack.pop()
            stack.append(position)
        at = bisect.bisect_left(stack, node.start)
        if at == len(stack):
            continue
        reached = entry[i] = stack[at]
        gain, cost, hops = prefix[reached][0]
        extended = (
            gain - (gains[i] if gains else 0),
            cost if cost > -node.score else -node.score,
            hops + 1,
        )
        known = prefix.get(node.after)
        if known is None:
            bisect.insort(pending, node.after)
            prefix[node.after] = (extended, i)
        elif extended < known[0]:
            prefix[node.after] = (extended, i)
    return prefix, entry


def _chain_back(
    usable: Sequence[_Node],
    prefix: dict[int, tuple[_Rank, int]],
    entry: dict[int, int],
    position: int,
) -> _Chain:
    """The best prefix reaching ``position``, read back hop by hop."""
    chain: list[_Node] = []
    hop = prefix[position][1]
    while hop != -1:
        chain.append(usable[hop])
        hop = prefix[entry[hop]][1]
    chain.reverse()
    return tuple(chain)


def _through_routes(
    usable: Sequence[_Node], num_layers: int
) -> tuple[list[int], Callable[[int], _Chain]]:
    """The nodes (indices) that lie on a complete route, best route through them first,
    and the reader of the best route through one of them (several nodes may share it).

    The route through a node joins the best prefix reaching a position within its
    shard (``_forward``), the node, and the best suffix after it: a backward pass keeps
    a heap of the nodes holding the current position.
    """
    prefix, entry = _forward(usable, num_layers)
    suffix: dict[int, tuple[_Rank, int]] = {num_layers: (_EMPTY, -1)}
    by_end = sorted(range(len(usable)), key=lambda i: usable[i].end, reverse=True)
    holders: list[tuple[_Rank, int]] = []  # (rank from the node to the end, index)
    cursor = 0
    for position in sorted({0, *(node.after for node in usable)} - {num_layers}, reverse=True):
        while cursor < len(by_end) and usable[by_end[cursor]].end >= position:
            i = by_end[cursor]
            cursor += 1
            known = suffix.get(usable[i].after)
            if known is not None:
                _, cost, hops = known[0]
                score = -usable[i].score
                heapq.heappush(holders, ((0, cost if cost > score else score, hops + 1), i))
        while holders and usable[holders[0][1]].start > position:
            heapq.heappop(holders)  # starts after this position, so after every later one
        if holders:
            suffix[position] = holders[0]
    through: list[tuple[float, int, int]] = []
    for i, position in entry.items():
        after = suffix.get(usable[i].after)
        if after is not None:
            front, back = prefix[position][0], after[0]
            cost = max(front[1], -usable[i].score, back[1])
            through.append((cost, front[2] + 1 + back[2], i))
    through.sort()

    def route_through(i: int) -> _Chain:
        chain = [*_chain_back(usable, prefix, entry, entry[i]), usable[i]]
        position = usable[i].after
        while position != num_layers:
            hop = suffix[position][1]
            chain.append(usable[hop])
            position = usable[hop].after
        return tuple(chain)

    return [i for *_, i in through], route_through


def _best_routes(usable: Sequence[_Node], num_layers: int, count: int) -> list[_Chain]:
    """Up to ``count`` complete routes by rank, best first (a bounded best-first search).

    A partial route's estimate is its bottleneck capped by the best bottleneck any
    suffix can have from its position, and its hops plus one: never better than a
    completion, so complete routes leave the heap in rank order. Each expansion
    pushes at most the ``count`` best next hops, and at most
    ``EXPANSIONS_PER_CANDIDATE × count`` partial routes are expanded.
    """
    reach = _best_suffix_bottleneck(usable, num_layers)
    nexts: dict[int, list[tuple[float, _Node]]] = {}
    order = itertools.count()
    heap: list[tuple[float, int, int, int, _Chain]] = [(-math.inf, 0, next(order), 0, ())]
    found: list[_Chain] = []
    budget = EXPANSIONS_PER_CANDIDATE * count
    while heap and len(found) < count:
        *_, position, chain = heapq.heappop(heap)
        if position == num_layers:
            found.append(chain)
            continue
        if budget <= 0:
            break
        budget -= 1
        options = nexts.get(position)
        if options is None:
            options = sorted(
                (
                    (max(-node.score, reach[node.after]), node)
                    for node in usable
                    if node.start <= position <= node.end and node.after in reach
                ),
                key=lambda option: (option[0], option[1].record.node_id),
            )
            nexts[position] = options
        own = -min((node.score for node in chain), default=math.inf)
        for cap, node in options[: count - len(found)]:
            done = node.after == num_layers
            heapq.heappush(
                heap,
                (
                    max(own, cap),
                    len(chain) + (1 if done else 2),
                    next(order),
                    node.after,
                    (*chain, node),
                ),
            )
    return found


def _best_suffix_bottleneck(usable: Sequence[_Node], num_layers: int) -> dict[int, float]:
    """For each position from which the model can be finished: the best bottleneck of a
    suffix from it (negated, as in a rank); positions missing cannot finish."""
    best: dict[int, float] = {num_layers: -math.inf}
    for position in sorted({0, *(node.after for node in usable)} - {num_layers}, reverse=True):
        values = [
            max(-node.score, best[node.after])
            for node in usable
            if node.start <= position <= node.end and node.after in best
        ]
        if values:
            best[position] = min(values)
    return best


def _plan(model_key: str, last_layer: int, chain: Sequence[NodeRecord]) -> RoutePlan:
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
    """The layer ranges no node serves, as inclusive (first, last) pairs, in order.

    Works on the nodes' shards, never layer by layer: its cost is O(n log n) for
    n nodes whatever ``num_layers`` a catalogue row says (a checkpoint's config
    is input, not a size to allocate by).
    """
    gaps: list[tuple[int, int]] = []
    reached = 0  # every layer below is served
    for start, end in sorted((n.shard_start, n.shard_end) for n in nodes):
        if reached >= num_layers:
            break
        if start > reached:
            gaps.append((reached, min(start, num_layers) - 1))
        reached = max(reached, end + 1)
    if reached < num_layers:
        gaps.append((reached, num_layers - 1))
    return gaps
