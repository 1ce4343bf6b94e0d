"""Sessions this tracker has in flight on each route: the load the choice sees.

``route_select`` opens a session for every decision it hands out, in one
step with the choice (``RouteLoad.open_chosen``: concurrent requests never
choose from the same snapshot). The proxy opens it again whenever it sends
the request on that decision (``route_session_open``: a retry after a busy
route), touches it as tokens arrive and closes it when the stream ends,
however it ends (``route_session_close``; ``route_sample_record`` closes it
too), so a failed or cancelled request does not count as load. A session
with no sign of life for ``SESSION_TTL`` seconds is forgotten, so a lost
close can only overstate a route's load for that long.

The load is counted per route, as peak-EWMA balancers count pending
requests per backend: a slow or saturated route holds its sessions longer,
so its count rises. (Counted per node instead, two routes through the same
bottleneck look equally loaded and the choice cannot tell which to shed to:
ADR-0011.) The nodes' own reports of their sessions enter each route's prior.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from routing_app.planner import RoutePlan

# How long a session counts without news: longer than the proxy's busy deadline
# and step timeouts, so only a lost close expires. A long generation stays
# counted because the proxy touches its session as tokens arrive.
SESSION_TTL = 900.0
# How long the book remembers when a route was last sent a request (for the
# bound on unsampled time, far below it in practice); older entries are dropped.
SENT_MEMORY = 86_400.0


class Decided(Protocol):
    """What the book keeps a session for: a decision naming its route."""

    @property
    def plan(self) -> RoutePlan: ...


DecisionT = TypeVar("DecisionT", bound=Decided)


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """Sessions in flight per route signature at one moment, and how long ago each
    route was last sent a request."""

    routes: Mapping[str, int] = field(default_factory=dict)
    sent_ago: Mapping[str, float] = field(default_factory=dict)

    def route_sessions(self, plan: RoutePlan) -> int:
        """Sessions in flight on exactly this route."""
        return self.routes.get(plan.signature, 0)

    def seconds_since_sent(self, plan: RoutePlan) -> float | None:
        """Seconds since this tracker last sent a request on the route (None: not lately)."""
        return self.sent_ago.get(plan.signature)


NO_LOAD = LoadSnapshot()


@dataclass(slots=True)
class _Session:
    decision: Decided  # held so the key (its identity) stays unique while open
    at: float


class RouteLoad:
    """Thread-safe book of the sessions this tracker process has open, per decision.

    A session is keyed by the decision object's identity (two requests may get
    equal decisions); the book holds the decision, so the identity stays unique
    while the session is open.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[int, _Session] = {}
        self._sent: dict[str, float] = {}  # route signature -> when last sent a request

    def open_chosen(self, choose: Callable[[LoadSnapshot], DecisionT]) -> DecisionT:
        """Choose with the load as it is now and open the chosen decision's session,
        as one step: no other choice sees the load between the two.

        ``choose`` runs under the book's lock, so it must not block (no
        database or network): read what it needs before.
        """
        with self._lock:
            decision = choose(self._snapshot())
            self._open(decision)
        return decision

    def open(self, decision: Decided) -> None:
        """Count ``decision``'s request as load on its route; idempotent, and it
        re-opens a closed session (a request sent again on the same decision)."""
        with self._lock:
            self._open(decision)

    def touch(self, decision: Decided) -> None:
        """The decision's request made progress: its session's TTL starts afresh.

        Does nothing to a closed session (a late touch never re-opens one).
        """
        with self._lock:
            session = self._sessions.get(id(decision))
            if session is not None:
                session.at = self.clock()

    def close(self, decision: Decided) -> None:
        """End the decision's session; closing twice (or an unknown one) does nothing."""
        with self._lock:
            self._sessions.pop(id(decision), None)

    def snapshot(self) -> LoadSnapshot:
        with self._lock:
            return self._snapshot()

    def _open(self, decision: Decided) -> None:
        now = self.clock()
        self._sessions[id(decision)] = _Session(decision, now)
        self._sent[decision.plan.signature] = now

    def _snapshot(self) -> LoadSnapshot:
        now = self.clock()
        for key in [k for k, s in self._sessions.items() if now - s.at > SESSION_TTL]:
            del self._sessions[key]
        for signature in [k for k, at in self._sent.items() if now - at > SENT_MEMORY]:
            del self._sent[signature]
        routes = Counter(s.decision.plan.signature for s in self._sessions.values())
        sent_ago = {signature: now - at for signature, at in self._sent.items()}
        return LoadSnapshot(routes=dict(routes), sent_ago=sent_ago)


_route_load = RouteLoad()


def route_load() -> RouteLoad:
    """This process's book of in-flight sessions."""
    return _route_load


def route_load_install(load: RouteLoad) -> RouteLoad:
    """Make ``load`` this process's book (tests start each from an empty one); returns
    the previous book."""
    global _route_load
    previous, _route_load = _route_load, load
    return previous
