"""Sessions this tracker has in flight on each route: the load the choice sees.

``route_choose`` opens a session for every decision it hands out, in one
step with the choice (``RouteLoad.open_chosen``: concurrent requests never
choose from the same snapshot). The proxy opens a session for each stream
it sends on that decision (``route_session_open``, again after a busy
route's wait; a request's several choices are several streams), touches it
as tokens arrive, with the tokens the stream has produced on the route
(``thompson-load`` reads each request's ``Pace`` as an early sample), and
closes it when the stream ends, however it ends (``route_session_close``;
``route_sample_record`` closes the decision), so a failed or cancelled
request does not count as load. A session with no sign of life for
``SESSION_TTL`` seconds is forgotten, so a lost close can only overstate a
route's load for that long.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, TypeVar

from routing_app.planning.route_plan import RoutePlan

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


class Pace(NamedTuple):
    """How far a request in flight on a route has got: ``tokens`` produced there in
    ``seconds`` since it was sent there (what its sample would be if it ended now:
    the proxy's sample is the same ratio), ``streaming`` of them since its first
    token, and ``planned``, the most it may produce there (its ``max_tokens`` less
    what it had produced on earlier routes; 0: not known). Only a request that has
    had its first token has a pace: a busy route's prefill is not a stall, and a
    request that yields no tokens (echo with ``max_tokens`` 0) has none."""

    tokens: int
    seconds: float
    streaming: float
    planned: int = 0

    def projected(self) -> float:
        """The tokens/s its sample will show if it streams on at its rate so far to its
        planned length (ADR-0011 §4).

        Taken as if it ended now, an early pace spreads the time to its first
        token over its first few tokens and reads slow, the more so the busier
        the route's prefills: the routes that take most of the traffic looked
        slower than their samples then showed. Carried on to ``planned`` the
        wait weighs as it will in the sample. ``planned`` is a bound (answers
        often end before it), so the projection leans fast by as much as an
        early end would have spread the wait over fewer tokens; without one, or
        at it, it is the pace as if it ended now.
        """
        tokens = max(self.tokens, 1)
        if self.planned <= tokens or tokens < 2:
            return tokens / self.seconds
        per_token = self.streaming / (tokens - 1)
        first = self.seconds - self.streaming
        return self.planned / (first + per_token * (self.planned - 1))


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """Sessions in flight per route signature at one moment, the pace of each
    request among them, and how long ago each route was last sent a request."""

    routes: Mapping[str, int] = field(default_factory=dict)
    sent_ago: Mapping[str, float] = field(default_factory=dict)
    paces: Mapping[str, Sequence[Pace]] = field(default_factory=dict)

    def route_sessions(self, plan: RoutePlan) -> int:
        """Sessions in flight on exactly this route."""
        return self.routes.get(plan.signature, 0)

    def route_paces(self, plan: RoutePlan) -> Sequence[Pace]:
        """How far each request in flight on the route has got, longest running first:
        one pace per request, as one sample is taken per request (when its several
        choices stream, the one sent there first)."""
        return self.paces.get(plan.signature, ())

    def seconds_since_sent(self, plan: RoutePlan) -> float | None:
        """Seconds since this tracker last sent a request on the route (None: not lately)."""
        return self.sent_ago.get(plan.signature)


NO_LOAD = LoadSnapshot()


@dataclass(slots=True)
class _Stream:
    """One session: the stream it counts (None: the request chosen but not
    streaming yet), when it was sent, its last sign of life, the most tokens it
    may produce on the route (0: not known), its tokens so far there and when the
    first of them came."""

    stream: object | None  # held so the key (its identity) stays unique while open
    sent: float
    touched: float
    planned: int = 0
    tokens: int = 0
    first_at: float | None = None

    def pace(self, now: float) -> Pace | None:
        if self.first_at is None:
            return None
        return Pace(self.tokens, now - self.sent, now - self.first_at, self.planned)


@dataclass(slots=True)
class _Sessions:
    """One decision's live sessions, by their stream's identity (0: the request
    chosen but not streaming yet)."""

    decision: Decided  # held so the key (its identity) stays unique while open
    live: dict[int, _Stream] = field(default_factory=dict)


# The key of a decision's session before any stream opens on it.
_CHOSEN = 0


def _key(stream: object | None) -> int:
    return _CHOSEN if stream is None else id(stream)


class RouteLoad:
    """Thread-safe book of the sessions this tracker process has open, per decision.

    Sessions are keyed by the decision object's identity (two requests may get
    equal decisions) and, within it, by the stream's: a request whose several
    choices stream on one decision counts once per live stream. The session
    the choice opens (no stream) stands for the request until its first
    stream opens and takes its place. The book holds the decision and the
    streams, so their identities stay unique while open.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[int, _Sessions] = {}
        self._sent: dict[str, float] = {}  # route signature -> when last sent a request

    def open_chosen(self, choose: Callable[[LoadSnapshot], DecisionT]) -> DecisionT:
        """Choose with the load as it is now and open the chosen decision's session,
        as one step: no other choice sees the load between the two.

        ``choose`` runs under the book's lock, so it must not block (no
        database or network): read what it needs before.
        """
        with self._lock:
            decision = choose(self._snapshot())
            self._open(decision, None)
        return decision

    def open(self, decision: Decided, stream: object | None = None, *, planned: int = 0) -> None:
        """Count ``decision``'s request (its ``stream``, if given, which may produce up to
        ``planned`` tokens there; 0: not known) as load on its route.

        Idempotent, and it re-opens a closed session (a stream sent again on the
        same decision, e.g. after waiting for a slot). A stream's session
        replaces the decision's session from the choice.
        """
        with self._lock:
            self._open(decision, stream, planned)

    def touch(
        self, decision: Decided, stream: object | None = None, *, tokens: int | None = None
    ) -> None:
        """The stream (or the request) made progress, to ``tokens`` produced on the
        route when given: its session's TTL starts afresh.

        Does nothing to a closed session (a late touch never re-opens one).
        """
        with self._lock:
            entry = self._sessions.get(id(decision))
            session = None if entry is None else entry.live.get(_key(stream))
            if session is not None:
                session.touched = self.clock()
                if tokens is not None:
                    session.tokens = tokens
                    if session.first_at is None and tokens > 0:
                        session.first_at = session.touched

    def close(self, decision: Decided, stream: object | None = None) -> None:
        """End ``stream``'s session on the decision, or with no ``stream`` every session
        on it; closing twice (or an unknown one) does nothing."""
        with self._lock:
            entry = self._sessions.get(id(decision))
            if entry is None:
                return
            if stream is not None:
                entry.live.pop(_key(stream), None)
            if stream is None or not entry.live:
                del self._sessions[id(decision)]

    def snapshot(self) -> LoadSnapshot:
        with self._lock:
            return self._snapshot()

    def _open(self, decision: Decided, stream: object | None, planned: int = 0) -> None:
        now = self.clock()
        entry = self._sessions.setdefault(id(decision), _Sessions(decision))
        if stream is None:
            if not entry.live:
                entry.live[_CHOSEN] = _Stream(None, now, now)
        else:
            entry.live.pop(_CHOSEN, None)
            if id(stream) not in entry.live:  # sent (again after a close): a new pace
                entry.live[id(stream)] = _Stream(stream, now, now, planned)
        self._sent[decision.plan.signature] = now

    def _snapshot(self) -> LoadSnapshot:
        now = self.clock()
        routes: Counter[str] = Counter()
        paces: dict[str, list[Pace]] = {}
        for key, entry in list(self._sessions.items()):
            for lost in [k for k, s in entry.live.items() if now - s.touched > SESSION_TTL]:
                del entry.live[lost]
            if not entry.live:
                del self._sessions[key]
                continue
            signature = entry.decision.plan.signature
            routes[signature] += len(entry.live)
            started = [p for p in (s.pace(now) for s in entry.live.values()) if p is not None]
            if started:
                paces.setdefault(signature, []).append(max(started, key=lambda p: p.seconds))
        for signature in [k for k, at in self._sent.items() if now - at > SENT_MEMORY]:
            del self._sent[signature]
        sent_ago = {signature: now - at for signature, at in self._sent.items()}
        for streams in paces.values():
            streams.sort(key=lambda pace: -pace.seconds)
        return LoadSnapshot(routes=dict(routes), sent_ago=sent_ago, paces=paces)


_route_load = RouteLoad()


def route_load() -> RouteLoad:
    """This process's book of in-flight sessions."""
    return _route_load
