"""Where a prompt's prefix is warm, and what prefill costs on each route: the tracker's
half of cache-aware routing (docs/adr/0029-cache-aware-routing.md).

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

Beside that it learns each route's cost of a prompt token and of an answer
token from the requests that completed on it (:class:`RouteCosts`): the time
to the first token over the prompt tokens the route computed, and the time
after it over the tokens after the first. A request's *warmth* on a route is
then ``ln(T_cold / T_warm)``: its expected time there computing its whole
prompt over its expected time computing only what the route does not hold.
The policy adds it to the route's score (ln tokens/s), so the prefill a route
would save is weighed against its learned speed and load on one scale.

Several tracker processes share what their routes served: each publishes
its own recent batches at the route statistics' sync (``routing_app.learning.sync``)
and takes in its peers' (:meth:`PrefixMemory.export`, :meth:`PrefixMemory.absorb`),
so a conversation's next turn is routed warm whichever process takes it. The
times are wall-clock times for that reason. The costs stay each process's own.
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
from routing_app.planning.route_plan import RoutePlan

# How long a node is taken to hold a prefix after a request on it last finished with
# it. A node evicts only for room (least recently used, within its KV budget): a quiet
# one keeps a prefix longer, a busy one may drop it sooner, and then a request sent on
# the belief computes its prompt as it would have anywhere.
PREFIX_MEMORY_SECONDS = 600.0
# (node, block) pairs this process remembers: 65,536 is 2 M prompt tokens' worth.
PREFIX_MEMORY_PAIRS = 65_536
# What a tracker process served in this many seconds is what it publishes to its peers
# at each sync (every 5 s): each peer reads every batch at least once, whatever its
# phase, and reading one twice changes nothing.
PREFIX_SHARE_SECONDS = 15.0
# The least weight a new timing gets in a route's cost averages.
COST_WEIGHT_FLOOR = 0.2
# A time to first token teaches the prompt token's cost only from a prompt this long
# computed: the first token's own step and the links' round trips are in that time,
# and spread over a few prompt tokens they would read as a slow prefill.
MIN_PREFILL_TOKENS = 64


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


@dataclass(slots=True)
class RouteCosts:
    """Seconds per prompt token computed, seconds per answer token after the first, and
    tokens per answer, on one route (or a model's routes together): weighted averages
    of completed requests'."""

    prompt: float | None = None
    answer: float | None = None
    answer_tokens: float | None = None
    prompt_mass: float = 0.0
    answer_mass: float = 0.0
    tokens_mass: float = 0.0

    def prompt_timed(self, seconds: float) -> None:
        self.prompt, self.prompt_mass = _averaged(self.prompt, self.prompt_mass, seconds)

    def answer_timed(self, seconds: float) -> None:
        self.answer, self.answer_mass = _averaged(self.answer, self.answer_mass, seconds)

    def answer_counted(self, tokens: int) -> None:
        self.answer_tokens, self.tokens_mass = _averaged(
            self.answer_tokens, self.tokens_mass, float(tokens)
        )


def _averaged(value: float | None, mass: float, sample: float) -> tuple[float, float]:
    if value is None:
        return sample, 1.0
    weight = max(1.0 / (mass + 1.0), COST_WEIGHT_FLOOR)
    return value + weight * (sample - value), mass + 1.0


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
    """Which nodes hold which prompt blocks, and each route's costs (thread-safe: the
    chat proxy records while the choice reads, on several threads)."""

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
        self._routes: dict[tuple[str, str], RouteCosts] = {}
        self._models: dict[str, RouteCosts] = {}
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

    def timed(
        self,
        *,
        plan: RoutePlan,
        prompt_computed: int,
        first_token_seconds: float | None,
        output_tokens: int,
        seconds: float,
    ) -> None:
        """A request completed on ``plan`` in ``seconds``: its first token after
        ``first_token_seconds`` (None: not known, e.g. after a failover) having computed
        ``prompt_computed`` prompt tokens, then ``output_tokens`` in all."""
        if first_token_seconds is None or first_token_seconds <= 0:
            return
        answer_tokens = output_tokens - 1
        with self._lock:
            kept = (
                self._routes.setdefault((plan.model_key, plan.signature), RouteCosts()),
                self._models.setdefault(plan.model_key, RouteCosts()),
            )
            for costs in kept:
                costs.answer_counted(output_tokens)
                if prompt_computed >= MIN_PREFILL_TOKENS:
                    costs.prompt_timed(first_token_seconds / prompt_computed)
                if answer_tokens > 0 and seconds > first_token_seconds:
                    costs.answer_timed((seconds - first_token_seconds) / answer_tokens)

    def costs(self, plan: RoutePlan) -> RouteCosts:
        """``plan``'s learned costs, each falling back on its model's routes' together."""
        with self._lock:
            own = self._routes.get((plan.model_key, plan.signature), RouteCosts())
            model = self._models.get(plan.model_key, RouteCosts())
        return RouteCosts(
            prompt=own.prompt if own.prompt is not None else model.prompt,
            answer=own.answer if own.answer is not None else model.answer,
            answer_tokens=model.answer_tokens,
        )

    def warmth(self, plans: Sequence[RoutePlan], prefix: RequestPrefix) -> Mapping[str, float]:
        """Each of ``plans``' warmth for ``prefix`` (ln speed-up; by signature, absent
        where nothing is held)."""
        if not prefix.claimable:
            return {}
        warm = {}
        for plan in plans:
            held = self.held(plan, prefix)
            if held:
                warm[plan.signature] = warmth(held=held, prefix=prefix, costs=self.costs(plan))
        return warm


_prefix_memory = PrefixMemory()


def prefix_memory() -> PrefixMemory:
    """This process's memory of warm prefixes and route costs."""
    return _prefix_memory
