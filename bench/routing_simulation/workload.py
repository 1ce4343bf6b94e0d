"""The simulated workload: requests in flight (``Session``), what is in flight now
(``Load``, as the tracker's load book would see it) and the events of a run.

Requests arrive as a Poisson stream, each asking for up to ``MAX_TOKENS`` and
generating ``TOKENS`` tokens after a prefill of ``PREFILL`` of its own decode
steps; each request's observed speed carries ``NOISE_SIGMA`` log-normal noise.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from routing_app.planning.route_plan import RoutePlan
from routing_app.policies.load import LoadSnapshot, Pace

NOISE_SIGMA = 0.10
TOKENS = (16, 256)
MAX_TOKENS = TOKENS[1]  # every request's max_tokens
# A request's prefill on a route (its time to first token), in its own decode
# steps: a chat prompt of some hundred tokens on a batching node.
PREFILL = (2.0, 20.0)
ISOLATED_RATE = 1.0  # requests/s of the first simulator (no interaction)
# At each fifth of a run, in this order.
EVENTS = ("slowdown", "recover", "join", "leave")


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
        # Every request asks for up to MAX_TOKENS and ends at its own length, as a
        # chat ends at its end of text: the tracker knows the bound, not the length.
        planned = (MAX_TOKENS - (self.tokens - self.route_tokens)) * self.noise
        return Pace(int(produced), now - self.started, now - self.first_at, int(planned))


@dataclass
class Load:
    """What is in flight now: the simulator's truth, and the tracker's view of it."""

    sessions: list[Session] = field(default_factory=list)
    isolated: bool = False  # sessions do not slow each other down
    now: float = 0.0
    sent: dict[str, float] = field(default_factory=dict)  # route -> when last sent a request

    def per_route(self) -> list[tuple[RoutePlan, int]]:
        """Sessions in flight per route (the simulator's truth; grouped by plan object)."""
        groups: dict[int, tuple[RoutePlan, int]] = {}
        for session in self.sessions:
            plan, count = groups.get(id(session.plan), (session.plan, 0))
            groups[id(plan)] = (plan, count + 1)
        return list(groups.values())

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
