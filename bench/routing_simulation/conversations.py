"""Multi-turn conversations on the replica topologies: cache-aware routing against cache-blind.

Conversations arrive as a Poisson stream. Each belongs to one of ``APPS``
apps, whose system prompt (``SYSTEM_TOKENS`` tokens) it starts with, and
runs ``TURNS`` turns; a turn adds a user message (``USER_TOKENS``) and its
answer (``workload.TOKENS``, up to ``MAX_TOKENS`` asked); the next turn
arrives when the answer ends plus a think time (exponential, mean
``THINK_SECONDS``). A turn's prompt is the system prompt, every earlier
message and answer, and its new message (the template's own tokens are left
out). Everything a conversation will say is drawn when it arrives, so every
policy on a seed serves the very same conversations.

Token ids are stand-ins: distinct per app's system prompt and per
conversation's messages, so two prompts share a block exactly where they
share a prefix. Their chain of block hashes is ``nodes_app``'s own
(``prefix_chain.block_hashes``, ``PREFIX_BLOCK_TOKENS`` a block) in one shared
prefix scope: a conversation's turn k+1 starts with turn k's prompt and
answer, and an app's conversations share its system prompt's blocks.

Each node keeps a prefix cache of ``NODE_CACHE_BLOCKS`` blocks (``NodeCache``):
when a turn completes on a route, each of its nodes keeps the blocks of
every token the turn ran but the last (prompt and answer, as ADR-0027's
``keep`` asks), evicting the least recently used block, a chain's last blocks
before its first (as a radix cache evicts leaves). A turn's cached prefix on
a route is the leading blocks *every* node of the route holds, never the
block that ends the prompt (the head computes the last prompt token). Its
prefill is the prompt tokens not cached × ``PROMPT_TOKEN_STEPS`` of its own
decode steps, then its answer's steps: the rest is the replica runs' model
(``topologies.Network``: speeds, batching, occupancy; ``workload.Session``).

The tracker's side is the real one: a ``RouteStatsStore`` takes each turn's
sample as the replica runs record it (its answer ÷ its time, with its
log-normal noise), and a ``PrefixMemory`` on the simulated clock and a
``RouteCostBook`` learn as ``routing_app.services.route_served_record`` teaches
them: after each turn, ``served`` with the prompt's blocks and ``timed`` with
its time to first token, the prompt tokens it computed, its answer and its
time. Before each turn, ``thompson-load`` chooses with
``warm = memory.warmth(plans, prefix, costs)`` (cache-aware, ``route_choose``'s
call) or with none (cache-blind). Beside them
an SGLang-style cache-aware router (``sglang_style``) and round-robin.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import statistics
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.routing_simulation.simulator import THOMPSON
from bench.routing_simulation.topologies import MODEL_KEY, Network, Scenario
from bench.routing_simulation.workload import MAX_TOKENS, NOISE_SIGMA, TOKENS, Load, Session
from nodes_app.protocol.limits import PREFIX_BLOCK_TOKENS
from nodes_app.shared.prefix_chain import block_hashes, chain_seed
from routing_app.learning.prefix_memory import PrefixMemory, RequestPrefix
from routing_app.learning.route_costs import RouteCostBook
from routing_app.learning.stats import RouteStatsStore
from routing_app.planning.route_plan import RoutePlan
from routing_app.policies.base import NO_WARMTH

APPS = 4  # system prompts shared by the conversations
SYSTEM_TOKENS = 650
TURNS = (2, 8)
USER_TOKENS = (20, 80)
THINK_SECONDS = 5.0  # mean think time between an answer's end and the next turn
# A prompt token's prefill in decode steps. bench_prefix_reuse.py (2026-12-07): SmolLM2
# on two CPU nodes takes 3.1-4.0 s to a first token over a ~1,000-token prompt and
# decodes at 14.2 tokens/s (70 ms a step): 3.5 ms a prompt token, 0.05 of a step, so a
# 650-token system prompt costs ~33 decode steps. (A GPU prefills relatively faster.)
PROMPT_TOKEN_STEPS = 0.05
NODE_CACHE_BLOCKS = 2048  # 65,536 tokens a node: a few thousand blocks
SCOPE = chain_seed(MODEL_KEY, "sim-conversations")  # one prefix scope for every request
# Stand-in token ids: app a's system prompt is a*SYSTEM_TOKENS onwards, conversation
# i's messages (i + 1)*ID_STRIDE onwards (fewer than ID_STRIDE tokens each).
ID_STRIDE = 1_000_000
# The SGLang router's cache-aware defaults (sgl-router's CacheAwareConfig in 2025:
# balance_abs_threshold 32, balance_rel_threshold 1.0001, cache_threshold 0.5; its
# successor SMG ships 64, 1.5 and 0.3).
BALANCE_ABS = 32
BALANCE_REL = 1.0001
CACHE_THRESHOLD = 0.5


class NodeCache:
    """One node's prefix cache: block hashes, least recently used first."""

    def __init__(self, capacity: int = NODE_CACHE_BLOCKS) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.blocks)

    def leading(self, blocks: Sequence[str], claimable: int) -> int:
        """How many of ``blocks``' first ``claimable`` it holds, from the first on."""
        count = 0
        while count < claimable and blocks[count] in self.blocks:
            count += 1
        return count

    def keep(self, blocks: Sequence[str]) -> None:
        """Hold ``blocks`` as just used, the first most recently: evicting takes the
        least recently used chain's last blocks first."""
        for block in reversed(blocks):
            self.blocks[block] = None
            self.blocks.move_to_end(block)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


@dataclass
class Conversation:
    """One conversation: what it will say (drawn when it arrives) and what it has said."""

    index: int
    app: int
    users: list[int]  # each turn's user message, tokens
    answers: list[int]  # each turn's answer, tokens
    thinks: list[float]  # seconds after each answer before the next turn
    noises: list[float]  # each turn's observed speed ÷ its route's (log-normal)
    tokens: list[int] = field(default_factory=list)  # the context so far
    hashes: list[str] = field(default_factory=list)  # its full blocks' chain, as far as known
    done: int = 0  # turns answered
    next_id: int = 0  # the next stand-in token id of its own

    def __post_init__(self) -> None:
        self.tokens = list(range(self.app * SYSTEM_TOKENS, (self.app + 1) * SYSTEM_TOKENS))
        self.next_id = (self.index + 1) * ID_STRIDE

    def say(self, count: int) -> None:
        self.tokens.extend(range(self.next_id, self.next_id + count))
        self.next_id += count

    def chain(self, tokens: int) -> list[str]:
        """The block hashes of the context's first ``tokens`` tokens (full blocks)."""
        upto = tokens // PREFIX_BLOCK_TOKENS * PREFIX_BLOCK_TOKENS
        known = len(self.hashes) * PREFIX_BLOCK_TOKENS
        if upto > known:  # the chain goes on from its last hash
            start = self.hashes[-1] if self.hashes else SCOPE
            self.hashes.extend(block_hashes(start, self.tokens[known:upto]))
        return self.hashes[: upto // PREFIX_BLOCK_TOKENS]


def conversation(index: int, rng: random.Random) -> Conversation:
    turns = rng.randint(*TURNS)
    return Conversation(
        index,
        rng.randrange(APPS),
        [rng.randint(*USER_TOKENS) for _ in range(turns)],
        [rng.randint(*TOKENS) for _ in range(turns)],
        [rng.expovariate(1.0 / THINK_SECONDS) for _ in range(turns)],
        [math.exp(rng.gauss(0, NOISE_SIGMA)) for _ in range(turns)],
    )


@dataclass(kw_only=True)
class Turn(Session):
    """A turn in flight: a ``Session`` whose prefill is its prompt's uncached tokens."""

    conversation: Conversation
    prefix: RequestPrefix  # the prompt as the tracker names it
    cached: int  # prompt tokens its route held
    kept: list[str]  # blocks of every token it runs but the last: what its nodes keep


@dataclass
class World:
    """What a router may look at: the truth (network, caches) and the tracker's books."""

    net: Network
    store: RouteStatsStore
    memory: PrefixMemory
    costs: RouteCostBook
    load: Load
    caches: dict[str, NodeCache]
    rng: random.Random

    def cached_tokens(self, plan: RoutePlan, prefix: RequestPrefix) -> int:
        """Prompt tokens ``plan`` starts past: the leading blocks every node holds."""
        claimable = prefix.claimable
        held = min(self.caches[n].leading(prefix.blocks, claimable) for n in plan.node_ids)
        return held * prefix.block_tokens


Router = Callable[[list[RoutePlan], RequestPrefix, World], RoutePlan]


def thompson(*, cache_aware: bool) -> Router:
    """The tracker's ``thompson-load`` choice, weighing each route's warmth for the
    prompt from the prefix memory (``cache_aware``) or not at all."""
    policy = THOMPSON.route_policy()

    def choose(plans: list[RoutePlan], prefix: RequestPrefix, world: World) -> RoutePlan:
        warm: Mapping[str, float] = (
            world.memory.warmth(plans, prefix, world.costs) if cache_aware else NO_WARMTH
        )
        arms = world.store.views(plans=plans, epoch=world.net.epoch)
        picked = policy.choose(arms, rng=world.rng, loads=world.load.snapshot(), warm=warm)
        assert picked is not None
        return picked.arm.plan

    return choose


def sglang_style(plans: list[RoutePlan], prefix: RequestPrefix, world: World) -> RoutePlan:
    """SGLang's cache-aware router's rule, over routes as its workers.

    A route's load is the requests in flight through its busiest node. If the
    loads are imbalanced (max − min > ``BALANCE_ABS`` and max >
    ``BALANCE_REL`` × min), the least loaded route; else the route with the
    highest prefix match rate (cached prompt tokens ÷ prompt tokens, the
    least loaded of equals) if it is over ``CACHE_THRESHOLD``; else the route
    whose nodes hold the fewest blocks. The match is read from the nodes'
    *true* caches, where SGLang reads its own approximate tree of what it
    sent: an anchor with perfect knowledge of the caches, blind to speeds.
    """
    at_nodes = Counter(n for session in world.load.sessions for n in session.plan.node_ids)
    loads = [max(at_nodes[n] for n in plan.node_ids) for plan in plans]
    low, high = min(loads), max(loads)
    indices = range(len(plans))
    if high - low > BALANCE_ABS and high > BALANCE_REL * low:
        return plans[loads.index(low)]
    rates = [world.cached_tokens(plan, prefix) / prefix.prompt_tokens for plan in plans]
    best = max(indices, key=lambda i: (rates[i], -loads[i]))
    if rates[best] > CACHE_THRESHOLD:
        return plans[best]
    sizes = [sum(len(world.caches[n]) for n in plan.node_ids) for plan in plans]
    return plans[min(indices, key=lambda i: (sizes[i], loads[i]))]


def round_robin() -> Router:
    counter = itertools.count()

    def choose(plans: list[RoutePlan], prefix: RequestPrefix, world: World) -> RoutePlan:
        return plans[next(counter) % len(plans)]

    return choose


@dataclass
class ConversationResult:
    ttft: list[float]  # per turn: seconds from its arrival to its first token
    latency: list[float]  # per turn: seconds from its arrival to its answer's end
    answer_tokens: int
    prompt_tokens: int
    cached_tokens: int
    seconds: float  # from the first arrival to the last answer's end

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens

    @property
    def throughput(self) -> float:
        """Answer tokens/s over the run."""
        return self.answer_tokens / self.seconds


def cold_work() -> float:
    """A conversation's mean decode steps with every prompt computed in full (no reuse):
    its answers plus its prompts' prefills, over the turn counts drawn uniformly."""
    user, answer = sum(USER_TOKENS) / 2, sum(TOKENS) / 2
    per_count = []
    for turns in range(TURNS[0], TURNS[1] + 1):
        prompts = sum(SYSTEM_TOKENS + k * (user + answer) + user for k in range(turns))
        per_count.append(turns * answer + PROMPT_TOKEN_STEPS * prompts)
    return statistics.mean(per_count)


def reuse_ceiling(seed: int, conversations: int) -> float:
    """The hit rate were every turn sent where its whole conversation so far is held
    (the first where its system prompt is): ``converse``'s conversations on ``seed``."""
    talk = random.Random(seed + 1)
    prompts = cached = 0
    for index in range(conversations):
        talker = conversation(index, talk)
        held = SYSTEM_TOKENS
        for user, answer in zip(talker.users, talker.answers, strict=True):
            prompt = len(talker.tokens) + user
            claimable = (prompt - 1) // PREFIX_BLOCK_TOKENS
            cached += min(held // PREFIX_BLOCK_TOKENS, claimable) * PREFIX_BLOCK_TOKENS
            prompts += prompt
            talker.say(user + answer)
            held = prompt + answer - 1
    return cached / prompts


def converse(
    scenario: Scenario, router: Router, seed: int, conversations: int, rate: float
) -> ConversationResult:
    """One run: ``conversations`` arriving at ``rate`` per second, every turn to its end."""
    net = Network(scenario)
    now = 0.0

    def clock() -> float:
        return now

    world = World(
        net,
        RouteStatsStore(half_life=600.0, min_sample_tokens=8, clock=clock),
        PrefixMemory(clock=clock),
        RouteCostBook(),
        Load(),
        {node_id: NodeCache() for node_id in net.nodes},
        random.Random(seed + 3),
    )
    load, plans = world.load, net.candidates()
    arrivals, talk = random.Random(seed), random.Random(seed + 1)
    due: list[tuple[float, int, Conversation]] = []  # next turns: (when, index, conversation)
    next_arrival = arrivals.expovariate(rate)
    began, arrived = next_arrival, 0
    ttft: list[float] = []
    latency: list[float] = []
    answer_tokens = prompt_tokens = cached_tokens = 0

    def start(talker: Conversation) -> None:
        turn = talker.done
        talker.say(talker.users[turn])
        prompt = len(talker.tokens)
        answer = talker.answers[turn]
        talker.say(answer)
        kept = talker.chain(prompt + answer - 1)
        prefix = RequestPrefix(
            blocks=tuple(kept[: prompt // PREFIX_BLOCK_TOKENS]),
            prompt_tokens=prompt,
            output_tokens=MAX_TOKENS,
        )
        load.now = now
        plan = router(plans, prefix, world)
        cached = world.cached_tokens(plan, prefix)
        load.sent[plan.signature] = now
        load.sessions.append(
            Turn(
                plan,
                net.epoch,
                answer,
                float(answer),
                now,
                started=now,
                noise=talker.noises[turn],
                prefill=(prompt - cached) * PROMPT_TOKEN_STEPS,
                conversation=talker,
                prefix=prefix,
                cached=cached,
                kept=kept,
            )
        )

    while arrived < conversations or due or load.sessions:
        in_flight = load.per_route()
        occupancy = net.occupancy(in_flight)
        by_route = {id(plan): net.session_tps(plan, occupancy) for plan, _ in in_flight}
        speeds = [by_route[id(s.plan)] for s in load.sessions]
        finish_in = [s.remaining / v for s, v in zip(load.sessions, speeds, strict=True)]
        soonest = min(range(len(finish_in)), key=finish_in.__getitem__, default=None)
        finish_at = now + finish_in[soonest] if soonest is not None else math.inf
        turn_at = due[0][0] if due else math.inf
        arrival_at = next_arrival if arrived < conversations else math.inf
        at = min(finish_at, turn_at, arrival_at)
        step = at - now
        for session, speed in zip(load.sessions, speeds, strict=True):
            session.remaining -= speed * step
            if session.first_at is None and session.remaining <= session.route_tokens:
                session.first_at = at - (session.route_tokens - session.remaining) / speed
        now = at
        if soonest is not None and at == finish_at:
            done = load.sessions.pop(soonest)
            assert isinstance(done, Turn) and done.first_at is not None
            elapsed = now - done.started
            first_token = done.first_at - done.started
            ttft.append(done.first_at - done.arrived)
            latency.append(now - done.arrived)
            answer_tokens += done.tokens
            prompt_tokens += done.prefix.prompt_tokens
            cached_tokens += done.cached
            # The proxy's sample, then what route_served_record teaches the tracker.
            world.store.arms.record_sample(
                model_key=MODEL_KEY,
                signature=done.plan.signature,
                epoch=done.epoch,
                output_tokens=done.tokens,
                tokens_per_second=done.tokens / elapsed * done.noise,
            )
            for node_id in done.plan.node_ids:
                world.caches[node_id].keep(done.kept)
            world.memory.served(plan=done.plan, blocks=done.prefix.blocks)
            world.costs.timed(
                plan=done.plan,
                prompt_computed=done.prefix.prompt_tokens - done.cached,
                first_token_seconds=first_token,
                output_tokens=done.tokens,
                seconds=elapsed,
            )
            talker = done.conversation
            talker.done += 1
            if talker.done < len(talker.answers):
                think = talker.thinks[talker.done - 1]
                heapq.heappush(due, (now + think, talker.index, talker))
        elif at == turn_at:
            start(heapq.heappop(due)[2])
        else:
            start(conversation(arrived, talk))
            arrived += 1
            next_arrival = now + arrivals.expovariate(rate)
    return ConversationResult(
        ttft, latency, answer_tokens, prompt_tokens, cached_tokens, now - began
    )
