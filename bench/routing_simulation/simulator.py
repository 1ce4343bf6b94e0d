"""The simulator: one seeded run of a policy over a topology and a workload.

The policies are ``routing_app``'s own (the configured ``RoutePolicy`` over a
real ``RouteStatsStore``), beside round-robin and an oracle that knows every
true speed and load. A run returns the throughput, the latencies, how fast
the policy moved traffic after each event and the longest any candidate went
unmeasured (``RunResult``).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from bench.routing_simulation.topologies import Network, Scenario, SimNode
from bench.routing_simulation.workload import (
    EVENTS,
    ISOLATED_RATE,
    NOISE_SIGMA,
    PREFILL,
    TOKENS,
    Load,
    Session,
)
from routing_app.learning.stats import RouteStatsStore
from routing_app.planning.route_plan import RoutePlan
from routing_app.policies.config import RoutePolicyConfig

THOMPSON = RoutePolicyConfig(policy="thompson-load")
# The default policy with the requests' paces hidden from it: what ADR-0011 §4 adds.
WITHOUT_PACES = "thompson-load without paces (§4 off)"
ROUND_ROBIN = "round-robin"
ORACLE = "oracle (all routes)"
ORACLE_CANDIDATES = "oracle (candidates only)"


Policy = Callable[
    [list[RoutePlan], RouteStatsStore, Network, Load, random.Random | None], RoutePlan
]


def bandit(config: RoutePolicyConfig, *, paces: bool = True) -> Policy:
    """The tracker's choice; ``paces=False`` hides the requests' paces from it (what
    ADR-0011 §4's early samples add, side by side)."""
    policy = config.route_policy()

    def choose(
        plans: list[RoutePlan],
        store: RouteStatsStore,
        net: Network,
        load: Load,
        rng: random.Random | None,
    ) -> RoutePlan:
        assert rng is not None
        arms = store.views(plans=plans, epoch=net.epoch)
        loads = load.snapshot()
        if not paces:
            loads = replace(loads, paces={})
        picked = policy.choose(arms, rng=rng, loads=loads)
        assert picked is not None
        return picked.arm.plan

    return choose


def round_robin() -> Policy:
    counter = itertools.count()

    def choose(
        plans: list[RoutePlan],
        store: RouteStatsStore,
        net: Network,
        load: Load,
        rng: random.Random | None,
    ) -> RoutePlan:
        return plans[next(counter) % len(plans)]

    return choose


def _fastest_now(routes: list[RoutePlan], net: Network, load: Load) -> RoutePlan:
    if load.isolated:
        return max(routes, key=net.session_tps)
    occupancy = net.occupancy(load.per_route())
    return max(routes, key=lambda route: net.joining_tps(route, occupancy))


def oracle(
    plans: list[RoutePlan],
    store: RouteStatsStore | None,
    net: Network,
    load: Load,
    rng: random.Random | None,
) -> RoutePlan:
    """The all-routes oracle: of every complete route (``Network.complete_routes``, not
    the planner's candidates), the one where the request runs fastest now, knowing
    every true speed and load, so the one where it finishes first (its work is the
    same on every route). Greedy: the request's own slowdown of the sessions already
    in flight is not counted, and no fast route is held back for the requests to come."""
    return _fastest_now(net.complete_routes(), net, load)


def oracle_over_candidates(
    plans: list[RoutePlan],
    store: RouteStatsStore | None,
    net: Network,
    load: Load,
    rng: random.Random | None,
) -> RoutePlan:
    """The same rule over the planner's candidates only: what the enumeration costs."""
    return _fastest_now(plans, net, load)


ORACLES: dict[str, Policy] = {
    ORACLE: oracle,
    ORACLE_CANDIDATES: oracle_over_candidates,
}


def expected_share(
    name: str,
    config: RoutePolicyConfig | None,
    policy: Policy,
    plans: list[RoutePlan],
    store: RouteStatsStore,
    net: Network,
    load: Load,
    target: str,
) -> float:
    signatures = [plan.signature for plan in plans]
    if target not in signatures:
        return 0.0
    if name == ROUND_ROBIN:
        return 1.0 / len(plans)
    if config is None:  # an oracle
        return 1.0 if policy(plans, store, net, load, None).signature == target else 0.0
    arms = store.views(plans=plans, epoch=net.epoch)
    loads = load.snapshot()
    if name == WITHOUT_PACES:
        loads = replace(loads, paces={})
    shares = config.route_policy().shares(arms, loads=loads, include_scout=False)
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
    served: float  # decode steps/s delivered (prefill included) from a fifth of the run to its end
    routes: Counter[str]  # requests sent per route signature (failovers included)
    nodes: Counter[str]  # requests sent per node (through a route that includes it)


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
    config: RoutePolicyConfig | None,
    seed: int,
    requests: int,
    rate: float | None,
) -> RunResult:
    """One run; ``rate`` requests/s with interaction, or ``None`` for the isolated setting.

    The events happen only in a scenario with a joiner (the replica scenarios run steady).
    """
    net = Network(scenario)
    now = 0.0
    store = RouteStatsStore(half_life=600.0, min_sample_tokens=8, clock=lambda: now)
    arrivals, work, noise = random.Random(seed), random.Random(seed + 1), random.Random(seed + 2)
    rng, prefills = random.Random(seed + 3), random.Random(seed + 4)
    event_at = (
        {requests * (i + 1) // 5: event for i, event in enumerate(EVENTS)}
        if scenario.joiner is not None
        else {}
    )
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
    window_from = requests // 5  # served work counts from this request's arrival ...
    window_start: float | None = None  # ... to the last arrival
    window_work = 0.0
    window_end = 0.0
    sent_routes: Counter[str] = Counter()
    sent_nodes: Counter[str] = Counter()

    def dispatch(session_tokens: int, remaining: float, arrived_at: float) -> None:
        load.now = now
        plan = policy(plans, store, net, load, rng)
        load.sent[plan.signature] = now
        sent_routes[plan.signature] += 1
        sent_nodes.update(plan.node_ids)
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

    def share(target: str) -> float:
        return expected_share(name, config, policy, plans, store, net, load, target)

    while arrived <= requests or load.sessions:
        in_flight = load.per_route()
        occupancy = None if rate is None else net.occupancy(in_flight)
        by_route = {id(plan): net.session_tps(plan, occupancy) for plan, _ in in_flight}
        speeds = [by_route[id(s.plan)] for s in load.sessions]
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
        if window_start is not None and arrival_open:
            window_work += sum(speeds) * step
        now += step
        if soonest is not None and load.sessions[soonest].remaining <= 1e-9:
            done = load.sessions.pop(soonest)
            latencies.append(now - done.arrived)
            tokens_total += done.tokens
            # The proxy's sample: the tokens of the request's last route over its time
            # there, its prefill included.
            observed = done.route_tokens / (now - done.started) * done.noise
            store.arms.record_sample(
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
        if request == window_from:
            window_start = now
        if (event is not None or request == requests) and targets:
            settled.append(share(targets[-1]))
        if request == requests:
            window_end = now
            continue
        if event is not None:
            victim = net.victim(plans)
            if event == "slowdown":
                slowed = net.nodes[victim]
                net.set_node(victim, replace(slowed, layer_seconds=slowed.layer_seconds * 5))
            elif event == "recover":
                assert slowed is not None
                net.set_node(slowed.record.node_id, slowed)
            elif event == "join":
                assert scenario.joiner is not None
                net.set_node(scenario.joiner.record.node_id, scenario.joiner)
                net.epoch += 1
            else:
                net.set_node(victim, None)
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
        if targets and to_majority[-1] is None and share(targets[-1]) > 0.5:
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
        window_work / (window_end - window_start) if window_start is not None else 0.0,
        sent_routes,
        sent_nodes,
    )
