"""Where a prompt's prefix is warm: the tracker's half of cache-aware routing
(docs/adr/0029-cache-aware-routing.md).

Nodes keep what a cleanly ended session computed, keyed by the prompt's chain
of block hashes (ADR-0027, ``nodes_app.shared.prefix_chain``); a route starts
a new request past the blocks *every* hop holds. The tracker never sees a
node's cache, but it knows what each route finished: when a request completes
on a route, each of the route's nodes holds the prompt's blocks (under the
request's scope, which seeds the chain). :class:`PrefixMemory` remembers those
(node, block) pairs, least recently used first, for
:data:`PREFIX_MEMORY_SECONDS` (a node evicts on its own, under its KV budget:
past that the tracker stops counting on it) and at most
:data:`PREFIX_MEMORY_PAIRS`.

With each route's cost of a prompt token and of an answer token
(``routing_app.learning.route_costs``), a request's *warmth* on a route is
``ln(T_cold / T_warm)``: its expected time there computing its whole prompt
over its expected time computing only what the route does not hold.
The policy adds it to the route's score (ln tokens/s), so the prefill a route
would save is weighed against its learned speed and load on one scale.

Several tracker processes share what their routes served: each publishes
its own recent batches at the route statistics' sync (``routing_app.learning.sync``)
and takes in its peers' (:meth:`PrefixMemory.export`, :meth:`PrefixMemory.absorb`),
so a conversation's next turn is routed warm whichever process takes it. The
times are wall-clock times for that reason.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodes_app.protocol.limits import PREFIX_BLOCK_TOKENS
from routing_app.learning.route_costs import RouteCostBook, RouteCosts
from routing_app.planning.route_plan import RoutePlan

# How long a node is taken to hold a prefix after a request on it last finished with
# it. A node evicts only for room (least recently used, within its KV budget): a quiet
# one keeps a prefix longer, a busy one may drop it sooner, and then a request sent on
# the belief computes its prompt as it would have anywhere.
PREFIX_MEMORY_SECONDS = 600.0
# (node, block) pairs this process remembers: 2 M prompt tokens' worth on one-node routes,
# half that on two-node routes.
PREFIX_MEMORY_PAIRS = 65_536
# What a tracker process served in this many seconds is what it publishes to its peers
# at each sync (every 5 s): each peer reads every batch at least once, whatever its
# phase, and reading one twice changes nothing.
PREFIX_SHARE_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class RequestPrefix:
    """What the choice knows of a request's prompt: its chain of block hashes (empty
    when the request has no prefix scope: it reuses nothing), how many tokens it has
    and how many the answer is expected to take."""

    blocks: tuple[str, ...]
    prompt_tokens: int
    output_tokens: int
    block_tokens: int = PREFIX_BLOCK_TOKENS

    @property
    def claimable(self) -> int:
        """Blocks a route can start past: the head always computes the last prompt
        token, so a block that ends the prompt is never taken from a cache."""
        return min(len(self.blocks), max(self.prompt_tokens - 1, 0) // self.block_tokens)


NO_PREFIX = RequestPrefix(blocks=(), prompt_tokens=0, output_tokens=0)


def warmth(*, held: int, prefix: RequestPrefix, costs: RouteCosts) -> float:
    """ln(T_cold / T_warm) for ``prefix`` on a route starting past ``held`` of its blocks
    whose costs are ``costs``; 0 with nothing held or either cost unknown.

    The answer is taken to be as long as the model's answers have been, at most the
    request's ``output_tokens`` (its ``max_tokens``: most answers end well before).
    """
    if held <= 0 or costs.prompt is None or costs.answer is None:
        return 0.0
    answer = float(prefix.output_tokens)
    if costs.answer_tokens is not None:
        answer = min(answer, costs.answer_tokens)
    saved = held * prefix.block_tokens * costs.prompt
    cold = prefix.prompt_tokens * costs.prompt + max(answer, 1.0) * costs.answer
    return math.log(cold / max(cold - saved, 1e-9))


class PrefixMemory:
    """Which nodes hold which prompt blocks (thread-safe: the chat proxy records while
    the choice reads, on several threads)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        seconds: float = PREFIX_MEMORY_SECONDS,
        pairs: int = PREFIX_MEMORY_PAIRS,
    ) -> None:
        self.clock, self.seconds, self.pairs = clock, seconds, pairs
        self._held: OrderedDict[tuple[str, str], float] = OrderedDict()
        # What this process served itself lately (when, the nodes, the blocks): its peers'
        # share of the memory.
        self._served: deque[tuple[float, tuple[str, ...], tuple[str, ...]]] = deque()
        self._lock = threading.Lock()

    def served(self, *, plan: RoutePlan, blocks: Iterable[str]) -> None:
        """``plan``'s route finished a request whose prompt had ``blocks``: each of its
        nodes holds them now (as ``keep`` asked it to)."""
        blocks = tuple(blocks)
        if not blocks:
            return
        now = self.clock()
        with self._lock:
            self._hold(plan.node_ids, blocks, now)
            self._served.append((now, plan.node_ids, blocks))
            self._served_trim(now)

    def _hold(self, node_ids: Iterable[str], blocks: Sequence[str], at: float) -> None:
        for node_id in node_ids:
            for block in blocks:
                pair = (node_id, block)
                if self._held.get(pair, -math.inf) <= at:
                    self._held[pair] = at
                    self._held.move_to_end(pair)
        while len(self._held) > self.pairs:
            self._held.popitem(last=False)

    def export(self) -> list[dict[str, Any]]:
        """What this process's routes served in the last :data:`PREFIX_SHARE_SECONDS`
        (never what it took in from its peers), as its peers read it."""
        with self._lock:
            self._served_trim(self.clock())
            return [
                {"at": at, "nodes": list(nodes), "blocks": list(blocks)}
                for at, nodes, blocks in self._served
            ]

    def _served_trim(self, now: float) -> None:
        while self._served and self._served[0][0] < now - PREFIX_SHARE_SECONDS:
            self._served.popleft()

    def absorb(self, batches: Iterable[dict[str, Any]]) -> None:
        """Take in the batches other processes exported: their nodes hold those blocks
        since then (a pair's later time wins, so a batch read twice changes nothing)."""
        with self._lock:
            for batch in batches:
                self._hold(
                    [str(n) for n in batch["nodes"]],
                    [str(b) for b in batch["blocks"]],
                    float(batch["at"]),
                )

    def held(self, plan: RoutePlan, prefix: RequestPrefix) -> int:
        """Leading blocks of ``prefix`` every node of ``plan`` is believed to hold."""
        claimable = prefix.claimable
        if not claimable:
            return 0
        with self._lock:
            return min(
                self._node_held(node_id, prefix.blocks, claimable) for node_id in plan.node_ids
            )

    def _node_held(self, node_id: str, blocks: Sequence[str], claimable: int) -> int:
        # A block's hash covers every token before it: holding block i is holding 0..i.
        oldest = self.clock() - self.seconds
        for count in range(claimable, 0, -1):
            at = self._held.get((node_id, blocks[count - 1]))
            if at is not None and at >= oldest:
                return count
        return 0

    def warmth(
        self, plans: Sequence[RoutePlan], prefix: RequestPrefix, costs: RouteCostBook
    ) -> Mapping[str, float]:
        """Each of ``plans``' warmth for ``prefix`` at the ``costs`` learned for them (ln
        speed-up; by signature, absent where nothing is held)."""
        if not prefix.claimable:
            return {}
        warm = {}
        for plan in plans:
            held = self.held(plan, prefix)
            if held:
                warm[plan.signature] = warmth(held=held, prefix=prefix, costs=costs.costs(plan))
        return warm


_prefix_memory = PrefixMemory()


def prefix_memory() -> PrefixMemory:
    """This process's memory of warm prefixes."""
    return _prefix_memory
