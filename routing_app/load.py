"""Sessions this tracker has in flight on each route and node: the load the choice sees.

``route_select`` opens a session for every decision it hands out and
``route_sample_record`` closes it when the request completes; the proxy also
closes it when a route's stream ends any other way (``route_session_close``),
so a failed or cancelled request does not count as load. A session nobody
closed is forgotten after ``SESSION_TTL`` seconds, so a lost close can only
overstate a route's load for that long.

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

from routing_app.planner import RoutePlan

# Longer than any generation the proxy lets run (its busy deadline and step
# timeouts end a stuck request well before), so only a lost close expires.
SESSION_TTL = 900.0


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """Sessions in flight per route signature at one moment."""

    routes: Mapping[str, int] = field(default_factory=dict)

    def route_sessions(self, plan: RoutePlan) -> int:
        """Sessions in flight on exactly this route."""
        return self.routes.get(plan.signature, 0)


NO_LOAD = LoadSnapshot()


class RouteLoad:
    """Thread-safe book of the sessions this tracker process has open, per decision.

    A session is keyed by the decision object's identity (two requests may get
    equal decisions); the book holds the decision, so the identity stays unique
    while the session is open.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[int, tuple[RoutePlan, float]] = {}
        self._holders: dict[int, object] = {}

    def open(self, decision: object, plan: RoutePlan) -> None:
        with self._lock:
            self._open[id(decision)] = (plan, self.clock())
            self._holders[id(decision)] = decision

    def close(self, decision: object) -> None:
        """End the decision's session; closing twice (or an unknown one) does nothing."""
        with self._lock:
            self._open.pop(id(decision), None)
            self._holders.pop(id(decision), None)

    def snapshot(self) -> LoadSnapshot:
        now = self.clock()
        routes: Counter[str] = Counter()
        with self._lock:
            for key in [k for k, (_, at) in self._open.items() if now - at > SESSION_TTL]:
                del self._open[key]
                del self._holders[key]
            for plan, _ in self._open.values():
                routes[plan.signature] += 1
        return LoadSnapshot(routes=dict(routes))


_route_load = RouteLoad()


def route_load() -> RouteLoad:
    """This process's book of in-flight sessions."""
    return _route_load
