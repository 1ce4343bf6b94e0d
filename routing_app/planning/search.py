"""Candidate enumeration (ADR-0021, amended by ADR-0018): the routes a model's nodes form.

``enumerate_routes`` works on ``NodeRecord`` values, not querysets: a cover
of every node that lies on a complete route, then the best priors, at most
``MAX_CANDIDATES``. ``uncovered_layers`` names the layers no node serves
(why there is no route). Nothing here touches the database.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from routing_app.planning.route_plan import NodeRecord, RoutePlan, plan_from_records, plan_rank

# At most this many candidate routes per model take part in the choice (ADR-0018): a
# cover of every node that lies on a complete route first, then the best priors.
MAX_CANDIDATES = 16
# The best-first search for the best-prior routes expands at most this many partial
# routes per candidate asked for.
EXPANSIONS_PER_CANDIDATE = 4


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
        plan_from_records(model_key, last_layer, [node.record for node in chain])
        for chain in chosen.values()
    ]
    return sorted(plans, key=plan_rank)


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
