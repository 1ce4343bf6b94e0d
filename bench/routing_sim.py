"""Routing simulator: the route choice policies against round-robin and an oracle, under load.

Seeded, no network, no database: the policies are ``routing_app``'s own
(``policy_choose`` over a real ``RouteStatsStore``), only the nodes are made up.

Two topologies (ADR-0020's GPU head + CPU full node, and a five-node mesh
with four candidate routes) whose nodes' *true* speed differs from the
benchmark they advertise (the prior). Requests arrive as a Poisson stream,
each generating 16-256 tokens. A session's speed is the inverse of its
per-token time summed over its hops: layers run × the node's per-layer time
× the node's batching slowdown, plus 4 ms of network per hop after the head.
A node serving k sessions at once runs a batch step k^0.6 times slower than
one alone, so its aggregate throughput grows as k^0.4 (2.3x at 8, as measured
with 64 tiny streams) up to ``BATCH_CAP`` sessions and stays flat beyond
(processor sharing: every session queues for its share). Each request's
observed speed on a route carries 10 % log-normal noise. A request first
spends 2-20 of its own decode steps in prefill on its route (its time to
first token; again after a failover; the capacity estimate counts it). A
sample is recorded when a request completes (its tokens ÷ its time on its
last route, prefill included), and while it runs the tracker sees its pace
(tokens so far, time since it was sent and since its first token, with the
same noise: it is the request that is slower or faster than its route's
usual), as the proxy reports it to the load book. ``thompson-load without
paces`` is the default policy with the paces hidden from it, side by side.

Load levels: ``isolated`` is the first simulator's setting (1 request/s,
each request served as if alone), the others put arrivals at a share of the
topology's estimated capacity (node-disjoint routes, fastest first, each at
its batching cap). Four events, at each fifth of the run: the fastest
route's own costliest node slows down 5x (no epoch bump: the statistics must
notice on their own); it recovers (the old best is best again: a policy must
retry a route it had learned to avoid); a fast full-model node joins
(epoch bump); the then fastest route's own node leaves (epoch bump; its
sessions fail over to a route the policy picks).

For each policy: throughput (tokens delivered ÷ the requests' end-to-end
time) as a ratio of the oracle's, which knows every true speed and load and
sends each request where it runs fastest now (greedy: it never holds a fast
route back for the requests to come, so near capacity a policy can beat it),
with the lowest and highest seed's ratio; p50/p99 end-to-end latency;
per event, how many requests passed before the policy's share on the new
fastest route passed 50 % (for ``thompson-load`` the draw's share: its
one-off scouts of unmeasured routes are not a move of traffic); and the
longest time any candidate had neither a request in flight nor a fresh
sample, and ``overdue``: the most any routing decision left a candidate idle
past the ``max_unsampled_seconds`` bound while it sent its request to one
that was not (0 for ``thompson-load``, whose next request goes to a route
due under the bound: the gap itself can exceed the bound by the wait for
that request, or for the next when two fall due between two requests), and
``late``: the same whatever the decision chose (it may have scouted another
route past the bound).

The knobs (the sample spread 0.3, ``load_exponent``, the bound) were tuned
on seeds 1-5; every setting is also run on held-out seeds 101-105.

Run: ``.venv/bin/python bench/routing_sim.py [--seeds N] [--requests N] [--quick]``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from routing_app.choice import policy_choose, route_shares
from routing_app.config import POLICY_ADR0021, RoutingConfig
from routing_app.load import LoadSnapshot, Pace
from routing_app.planner import NodeRecord, RoutePlan, enumerate_routes
from routing_app.stats import RouteStatsStore

HOP_SECONDS = 0.004  # network time per token for every hop after the head
NOISE_SIGMA = 0.10
BATCH_EXPONENT = 0.4  # a node's aggregate throughput grows as k^0.4 ...
BATCH_CAP = 8  # ... up to this many sessions; beyond, the sessions share it
TOKENS = (16, 256)
# A request's prefill on a route (its time to first token), in its own decode
# steps: a chat prompt of some hundred tokens on a batching node.
PREFILL = (2.0, 20.0)
ISOLATED_RATE = 1.0  # requests/s of the first simulator (no interaction)


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


@dataclass
class Session:
    plan: RoutePlan
    epoch: int
    tokens: int
    remaining: float
    arrived: float
    started: float
    noise: float  # how this request's observed speed differs from the route's (log-normal)
    prefill: float  # work before its first token on this route, in its own token-times
    route_tokens: float = 0.0  # tokens to produce on this route (after a failover: fewer)
    first_at: float | None = None  # when its first token on this route came

    def __post_init__(self) -> None:
        self.route_tokens = self.remaining
        self.remaining += self.prefill  # ``remaining`` is work: the prefill, then the tokens

    def pace(self, now: float) -> Pace | None:
        """As the tracker sees it (with the request's noise): tokens produced on this
        route, seconds since it was sent there and since its first token there."""
        if self.first_at is None:
            return None
        produced = (self.route_tokens - self.remaining) * self.noise
        return Pace(int(produced), now - self.started, now - self.first_at)


@dataclass
class Load:
    """What is in flight now: the simulator's truth, and the tracker's view of it."""

    sessions: list[Session] = field(default_factory=list)
    isolated: bool = False  # sessions do not slow each other down
    now: float = 0.0
    sent: dict[str, float] = field(default_factory=dict)  # route -> when last sent a request

    def per_node(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for session in self.sessions:
            counts.update(session.plan.node_ids)
        return counts

    def snapshot(self) -> LoadSnapshot:
        sent_ago = {signature: self.now - at for signature, at in self.sent.items()}
        paces: dict[str, list[Pace]] = {}
        for session in self.sessions:
            pace = session.pace(self.now)
            if pace is not None:
                paces.setdefault(session.plan.signature, []).append(pace)
        for streams in paces.values():
            streams.sort(key=lambda pace: -pace.seconds)
        if self.isolated:  # requests as if alone: nothing is load, but each shows its pace
            return LoadSnapshot(sent_ago=sent_ago, paces=paces)
        routes = dict(Counter(s.plan.signature for s in self.sessions))
        return LoadSnapshot(routes=routes, sent_ago=sent_ago, paces=paces)


Policy = Callable[[list[RoutePlan], RouteStatsStore, Network, Load, random.Random], RoutePlan]


def bandit(config: RoutingConfig, *, paces: bool = True) -> Policy:
    """The tracker's choice; ``paces=False`` hides the requests' paces from it (what
    ADR-0011 §4's early samples add, side by side)."""

    def choose(
        plans: list[RoutePlan], store: RouteStatsStore, net: Network, load: Load, rng: random.Random
    ) -> RoutePlan:
        arms = store.views(plans=plans, epoch=net.epoch)
        loads = load.snapshot()
        if not paces:
            loads = replace(loads, paces={})
        picked = policy_choose(arms=arms, config=config, rng=rng, loads=loads)
        assert picked is not None
        return picked[0].plan

    return choose


def round_robin() -> Policy:
    counter = itertools.count()

    def choose(
        plans: list[RoutePlan], store: RouteStatsStore, net: Network, load: Load, rng: random.Random
    ) -> RoutePlan:
        return plans[next(counter) % len(plans)]

    return choose


def oracle(
    plans: list[RoutePlan],
    store: RouteStatsStore | None,
    net: Network,
    load: Load,
    rng: random.Random | None,
) -> RoutePlan:
    """Where the request runs fastest now, knowing every true speed and load (greedy)."""
    counts = load.per_node()

    def speed(plan: RoutePlan) -> float:
        return net.session_tps(plan, None if load.isolated else counts + Counter(plan.node_ids))

    return max(plans, key=speed)


def expected_share(
    name: str, config: RoutingConfig | None, plans, store, net: Network, load: Load, target: str
) -> float:
    signatures = [plan.signature for plan in plans]
    if target not in signatures:
        return 0.0
    if name == "round-robin":
        return 1.0 / len(plans)
    if name == "oracle":
        return 1.0 if oracle(plans, store, net, load, None).signature == target else 0.0
    assert config is not None
    arms = store.views(plans=plans, epoch=net.epoch)
    loads = load.snapshot()
    if name == WITHOUT_PACES:
        loads = replace(loads, paces={})
    shares = route_shares(arms=arms, config=config, loads=loads, include_scout=False)
    return shares[signatures.index(target)]


@dataclass
class RunResult:
    throughput: float
    latencies: list[float]
    to_majority: list[int | None]  # per event; None: not before the next event (or the end)
    settled: list[float]  # per event: share on the new best just before the next event
    longest_gap: float  # seconds a candidate had neither a request in flight nor a sample
    overdue: float  # seconds past the bound a candidate was passed over by a decision
    late: float  # seconds past the bound a decision left one idle (it may have scouted another)


class GapWatch:
    """Per candidate: since when it has had neither a request in flight nor a fresh sample."""

    def __init__(self, bound: float) -> None:
        self.idle_since: dict[str, float] = {}
        self.current: set[str] = set()
        self.longest = 0.0
        self.bound = bound
        self.overdue = 0.0  # longest a candidate was passed over past the bound by a decision
        self.late = 0.0  # longest a decision left one idle past the bound, whatever it chose
        self.chose_overdue = False  # the last request went to a candidate past the bound

    def candidates(self, plans: list[RoutePlan], now: float, load: Load) -> None:
        busy = {session.plan.signature for session in load.sessions}
        self.current = {plan.signature for plan in plans}
        for signature in list(self.idle_since):
            if signature not in self.current:
                del self.idle_since[signature]
        for signature in self.current - busy:
            self.idle_since.setdefault(signature, now)

    def dispatched(self, signature: str, now: float) -> None:
        since = self.idle_since.pop(signature, None)
        self.chose_overdue = since is not None and now - since > self.bound
        if since is not None:
            self.longest = max(self.longest, now - since)

    def decided(self, now: float) -> None:
        """A request was routed: how far past the bound did it pass over an idle candidate?
        (Sent to another candidate past the bound, it could not have measured both.)"""
        for since in self.idle_since.values():
            self.late = max(self.late, now - since - self.bound)
            if not self.chose_overdue:
                self.overdue = max(self.overdue, now - since - self.bound)

    def finished(self, signature: str, now: float, load: Load) -> None:
        if signature in self.current and all(
            session.plan.signature != signature for session in load.sessions
        ):
            self.idle_since[signature] = now

    def close(self, now: float) -> float:
        for since in self.idle_since.values():
            self.longest = max(self.longest, now - since)
        return self.longest


def simulate(
    scenario: Scenario,
    name: str,
    policy: Policy,
    config: RoutingConfig | None,
    seed: int,
    requests: int,
    rate: float | None,
) -> RunResult:
    """One run; ``rate`` requests/s with interaction, or ``None`` for the isolated setting."""
    net = Network(scenario)
    now = 0.0
    store = RouteStatsStore(half_life=600.0, min_sample_tokens=8, clock=lambda: now)
    arrivals, work, noise = random.Random(seed), random.Random(seed + 1), random.Random(seed + 2)
    rng, prefills = random.Random(seed + 3), random.Random(seed + 4)
    event_at = {requests * (i + 1) // 5: event for i, event in enumerate(EVENTS)}
    load = Load(isolated=rate is None)
    gaps = GapWatch(THOMPSON.max_unsampled_seconds)
    slowed: SimNode | None = None  # the slowed node as it was, until it recovers
    latencies: list[float] = []
    tokens_total = 0.0
    targets: list[str] = []
    to_majority: list[int | None] = []
    settled: list[float] = []
    began = 0
    plans = net.candidates()
    gaps.candidates(plans, now, load)
    next_arrival = arrivals.expovariate(rate or ISOLATED_RATE)
    arrived = 0

    def dispatch(session_tokens: int, remaining: float, arrived_at: float) -> None:
        load.now = now
        plan = policy(plans, store, net, load, rng)
        load.sent[plan.signature] = now
        gaps.dispatched(plan.signature, now)
        load.sessions.append(
            Session(
                plan,
                net.epoch,
                session_tokens,
                remaining,
                arrived_at,
                started=now,
                noise=math.exp(noise.gauss(0, NOISE_SIGMA)),
                prefill=prefills.uniform(*PREFILL),
            )
        )

    while arrived <= requests or load.sessions:
        counts = None if rate is None else load.per_node()
        speeds = [net.session_tps(s.plan, counts) for s in load.sessions]
        finish_in = [s.remaining / v for s, v in zip(load.sessions, speeds, strict=True)]
        soonest = min(range(len(finish_in)), key=finish_in.__getitem__, default=None)
        arrival_open = arrived <= requests
        if soonest is not None and (not arrival_open or now + finish_in[soonest] < next_arrival):
            step = finish_in[soonest]
        else:
            step = next_arrival - now
        for session, speed in zip(load.sessions, speeds, strict=True):
            session.remaining -= speed * step
            if session.first_at is None and session.remaining <= session.route_tokens:
                session.first_at = now + step - (session.route_tokens - session.remaining) / speed
        now += step
        if soonest is not None and load.sessions[soonest].remaining <= 1e-9:
            done = load.sessions.pop(soonest)
            latencies.append(now - done.arrived)
            tokens_total += done.tokens
            # The proxy's sample: the tokens of the request's last route over its time
            # there, its prefill included.
            observed = done.route_tokens / (now - done.started) * done.noise
            store.record_sample(
                model_key="sim",
                signature=done.plan.signature,
                epoch=done.epoch,
                output_tokens=round(done.route_tokens),
                tokens_per_second=observed,
            )
            gaps.finished(done.plan.signature, now, load)
            continue
        # An arrival: first the event due at this request, then the request itself.
        request = arrived
        arrived += 1
        next_arrival = now + arrivals.expovariate(rate or ISOLATED_RATE)
        event = event_at.get(request)
        load.now = now
        if (event is not None or request == requests) and targets:
            settled.append(expected_share(name, config, plans, store, net, load, targets[-1]))
        if request == requests:
            continue
        if event is not None:
            victim = net.victim(plans)
            if event == "slowdown":
                slowed = net.nodes[victim]
                net.nodes[victim] = replace(slowed, layer_seconds=slowed.layer_seconds * 5)
            elif event == "recover":
                assert slowed is not None
                net.nodes[slowed.record.node_id] = slowed
            elif event == "join":
                net.nodes[scenario.joiner.record.node_id] = scenario.joiner
                net.epoch += 1
            else:
                del net.nodes[victim]
                net.epoch += 1
            plans = net.candidates()
            gaps.candidates(plans, now, load)
            if event == "leave":  # its sessions fail over, their segment unrecorded
                failed = [s for s in load.sessions if victim in s.plan.node_ids]
                load.sessions = [s for s in load.sessions if victim not in s.plan.node_ids]
                for session in failed:
                    gaps.finished(session.plan.signature, now, load)
                    # Its tokens so far are replayed on the new route: another prefill.
                    left = min(session.remaining, session.route_tokens)
                    dispatch(session.tokens, left, session.arrived)
            targets.append(net.fastest(plans).signature)
            to_majority.append(None)
            began = request
        load.now = now
        if (
            targets
            and to_majority[-1] is None
            and expected_share(name, config, plans, store, net, load, targets[-1]) > 0.5
        ):
            to_majority[-1] = request - began
        tokens = work.randint(*TOKENS)
        dispatch(tokens, float(tokens), now)
        gaps.decided(now)
    return RunResult(
        tokens_total / sum(latencies),
        latencies,
        to_majority,
        settled,
        gaps.close(now),
        gaps.overdue,
        gaps.late,
    )


EVENTS = ("slowdown", "recover", "join", "leave")
THOMPSON = RoutingConfig(policy="thompson-load")
# The default policy with the requests' paces hidden from it: what ADR-0011 §4 adds.
WITHOUT_PACES = "thompson-load without paces (§4 off)"
POLICIES: list[tuple[str, RoutingConfig | None]] = [
    ("thompson-load (ADR-0011 default)", THOMPSON),
    (WITHOUT_PACES, THOMPSON),
    ("adr0021 default (explore 0.3, alpha 1)", RoutingConfig(policy=POLICY_ADR0021)),
    (
        "adr0021 tuned (explore 0.1, alpha 2)",
        RoutingConfig(policy=POLICY_ADR0021, explore_share=0.1, weight_alpha=2.0),
    ),
    ("round-robin", None),
    ("oracle", None),
]
# (label, share of the estimated capacity; None: the isolated setting)
LOADS: list[tuple[str, float | None]] = [
    ("isolated (1 req/s, no interaction)", None),
    ("light (10% of capacity)", 0.1),
    ("medium (50% of capacity)", 0.5),
    ("near capacity (90%)", 0.9),
]


def policy_for(name: str, config: RoutingConfig | None) -> Policy:
    if config is not None:
        return bandit(config, paces=name != WITHOUT_PACES)
    return round_robin() if name == "round-robin" else oracle


def describe(answers: list[int | None], settled: list[float]) -> str:
    share = f"{statistics.mean(settled):.0%}"
    reached = [answer for answer in answers if answer is not None]
    if len(reached) < len(answers):
        return f"never in {len(answers) - len(reached)}/{len(answers)} (settles {share})"
    return f"{statistics.median(reached):.0f} (max {max(reached)}; settles {share})"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def seed_sets(count: int) -> list[tuple[str, range]]:
    """The seeds the knobs were tuned on (1..count) and as many held out (101..)."""
    return [
        (f"tuning seeds 1-{count}", range(1, count + 1)),
        (f"held-out seeds 101-{100 + count}", range(101, 101 + count)),
    ]


def report(results: dict[str, list[RunResult]]) -> None:
    """One line per policy (mean and per-seed range of the ratio), one per event."""
    oracle_tp = [run.throughput for run in results["oracle"]]
    for name, _ in POLICIES:
        runs = results[name]
        ratios = [run.throughput / best for run, best in zip(runs, oracle_tp, strict=True)]
        latencies = [value for run in runs for value in run.latencies]
        print(
            f"{name:40} {statistics.mean(ratios):6.3f} x oracle "
            f"[{min(ratios):.3f}-{max(ratios):.3f}]  "
            f"p50 {percentile(latencies, 0.5):6.2f}  p99 {percentile(latencies, 0.99):7.2f}"
            f"  gap {max(run.longest_gap for run in runs):6.0f}"
            f" (overdue {max(run.overdue for run in runs):3.0f},"
            f" late {max(run.late for run in runs):3.0f})"
        )
        for index, event in enumerate(EVENTS):
            answers = [run.to_majority[index] for run in runs]
            settled = [run.settled[index] for run in runs]
            print(f"    {event:9} {describe(answers, settled)}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Routing policy simulator")
    parser.add_argument("--seeds", type=int, default=5, help="per seed set (tuning, held-out)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="3 seeds x 1000 requests")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.requests = 3, 1000
    at = ", ".join(f"{args.requests * (i + 1) // 5} ({event})" for i, event in enumerate(EVENTS))
    print(
        f"routing simulator: {args.seeds} tuning + {args.seeds} held-out seeds x "
        f"{args.requests} requests; events at request {at}; the slowdown is 5x; "
        f"thompson-load bound {THOMPSON.max_unsampled_seconds:.0f} s unsampled"
    )
    print(
        "columns: mean ratio to the oracle's throughput [lowest-highest seed], p50/p99 "
        "end-to-end latency (s), longest time a candidate went unsampled (s), the most a "
        "request's routing passed one over past the bound (overdue) or left one idle past it "
        "while scouting another (late); per event, median requests until "
        "the share on the new fastest route passed 50% (max over seeds)"
    )
    for scenario in SCENARIOS:
        capacity = Network(scenario).capacity_rps()
        for label, utilisation in LOADS:
            rate = None if utilisation is None else utilisation * capacity
            shown = "" if rate is None else f", {rate:.2f} req/s"
            for seeds_label, seeds in seed_sets(args.seeds):
                print(f"\n== {scenario.name} — {label}{shown} — {seeds_label}")
                report(
                    {
                        name: [
                            simulate(
                                scenario,
                                name,
                                policy_for(name, cfg),
                                cfg,
                                seed,
                                args.requests,
                                rate,
                            )
                            for seed in seeds
                        ]
                        for name, cfg in POLICIES
                    }
                )


if __name__ == "__main__":
    main()
