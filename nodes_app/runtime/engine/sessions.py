"""Per-session K/V on a node: admitted against a memory budget, freed at the session's end.

A session belongs to one generation and one layer range. Its steps are
serialised by its lock; positions must follow each other exactly, so a lost or
repeated step is refused instead of corrupting the cache.

Admission is by memory, not by count: a session reserves the bytes of the
positions it may reach (``reserve`` positions × the bytes one position takes
in its layers, plus the fixed states of its linear-attention layers) and is
admitted while the node's reservations fit its KV budget; past it the node
answers 503 ``node_busy`` (the tracker queues and retries). A session that
outgrows its reservation is never failed for it: the reservation grows, and
new sessions wait until it shrinks again. An optional ``max_sessions``
ceiling remains for operators and tests that want a count.

A session ends when its generation ends or is cancelled, and otherwise when
its plan says the request is over (ADR-0002, "What a plan lets a hop hold"):
at its ``deadline`` (the plan's ``ends_at``), running step or not, or once
it has waited longer than its ``idle_limit`` (the plan's ``idle_seconds``)
for a step. The node's own idle timeout bounds the rest (a dev-open node's
sessions, the head's own).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nodes_app.runtime.engine.prefix_cache import PrefixCache
from nodes_app.runtime.engine.sampler import TokenPicker
from nodes_app.runtime.faults import RuntimeRequestError

# Far longer than a head waits on each hop for one step (the step timeout,
# 30 s by default; a long prefill gets more, protocol.limits.step_time_limit): a live
# session is never reaped between two of its steps.
IDLE_TIMEOUT_SECONDS = 600.0


@dataclass(frozen=True)
class DraftRound:
    """A session's last step was a draft round (speculative decoding, ADR-0028).

    It ran ``length`` positions from ``position``; the next step's position
    says how many were kept, at least the first (the token the round
    followed). For a state with linear-attention layers, which goes back to
    the round's start only, the round's input is kept to recompute the kept
    positions: the head's token ids (``tokens``) or a hop's hidden states
    ``[1, length, H]`` (``hidden``), and the step's ids for a family whose
    layers take them (``ids``).
    """

    position: int
    length: int
    tokens: list[int] | None = None
    hidden: Any = None
    ids: list[int] | None = None


@dataclass
class Session:
    session_id: str
    start: int
    end: int
    cache: Any
    position: int = 0
    # The last hop's token choices, made by the session's opening step.
    picker: TokenPicker | None = None
    # SHA-256 of the capability that opened it; None (dev-open): anyone may step it.
    capability: bytes | None = None
    # Positions reserved against the node's KV budget, and what they cost in bytes.
    reserve: int = 0
    reserved_bytes: int = 0
    # Set when the store drops it: a step still queued for it is not computed.
    closed: bool = False
    # Its last step was a draft round, not yet settled by the next step's position.
    draft_round: DraftRound | None = None
    # Opened by a prefix claim (ADR-0027): its first step may start at any position it
    # can be cut back to, up to what the claim found.
    claimed: bool = False
    # The scope its state may be shared in ("" on a dev-open node: the head's chain
    # is trusted as seeded); None: nothing of it is looked up or kept.
    prefix_scope: str | None = None
    # What its plan lets it hold: positions at most (None: no plan bound); when it
    # ends, on the store's clock, whatever it is doing; how long it may wait idle
    # (the store sets it: the plan's bound or its own timeout, whichever is shorter).
    max_positions: int | None = None
    deadline: float | None = None
    idle_limit: float = IDLE_TIMEOUT_SECONDS
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The store's clock, so that idle time is measured on the clock that reaps.
    clock: Callable[[], float] = time.monotonic
    last_used: float = field(init=False)

    def __post_init__(self) -> None:
        self.last_used = self.clock()

    def touch(self) -> None:
        self.last_used = self.clock()

    def over(self, now: float) -> bool:
        """Whether its plan's request is over at ``now`` (the store's clock)."""
        return self.deadline is not None and now >= self.deadline

    def admits(self, capability: bytes | None) -> bool:
        """Whether a step presenting ``capability`` (its hash) may use this session."""
        if self.capability is None:
            return True
        return capability is not None and hmac.compare_digest(capability, self.capability)


def _busy(message: str) -> RuntimeRequestError:
    return RuntimeRequestError(message, code="node_busy", status=503, error_type="server_error")


class SessionStore:
    def __init__(
        self,
        *,
        kv_budget: int,
        idle_timeout: float,
        max_sessions: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        prefix: PrefixCache | None = None,
    ) -> None:
        self.kv_budget = kv_budget
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self.reserved = 0
        # Ended sessions' state kept for reuse (ADR-0027): inside the same budget,
        # evicted whenever a live session needs the room.
        self.prefix = prefix if prefix is not None else PrefixCache()

    def _make_room(self, needed: int) -> None:
        """Evict prefix cache until ``needed`` more reserved bytes fit beside it, if they can."""
        over = self.reserved + needed + self.prefix.nbytes - self.kv_budget
        if over > 0:
            self.prefix.evict(over)

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def create(
        self,
        session_id: str,
        *,
        start: int,
        end: int,
        cache: Any,
        reserve: int = 0,
        reserved_bytes: int = 0,
        capability: bytes | None = None,
        max_positions: int | None = None,
        lifetime: float | None = None,
        idle_limit: float | None = None,
    ) -> Session:
        """Admit a session reserving ``reserved_bytes`` (for ``reserve`` positions), or 503.

        ``max_positions``, ``lifetime`` (seconds from now) and ``idle_limit``
        are its plan's bounds (None: none but the store's idle timeout).
        """
        if session_id in self._sessions:
            raise RuntimeRequestError(
                f"session {session_id} already exists: position 0 starts a new session",
                code="session_exists",
            )
        if self.max_sessions is not None and len(self._sessions) >= self.max_sessions:
            raise _busy(
                f"node is at its cap of {self.max_sessions} concurrent sessions; retry later"
            )
        self._make_room(reserved_bytes)
        if self.reserved + reserved_bytes > self.kv_budget:
            raise _busy(
                f"node's KV budget is spent ({self.reserved / 2**20:.1f} of "
                f"{self.kv_budget / 2**20:.1f} MiB reserved; this session needs "
                f"{reserved_bytes / 2**20:.1f} MiB); retry later"
            )
        session = Session(
            session_id=session_id,
            start=start,
            end=end,
            cache=cache,
            capability=capability,
            reserve=reserve,
            reserved_bytes=reserved_bytes,
            clock=self.clock,
            max_positions=max_positions,
            idle_limit=self.idle_timeout
            if idle_limit is None
            else min(idle_limit, self.idle_timeout),
        )
        if lifetime is not None:
            session.deadline = session.last_used + lifetime
        self._sessions[session_id] = session
        self.reserved += reserved_bytes
        return session

    def extend(self, session: Session, *, reserve: int, reserved_bytes: int) -> None:
        """Grow a live session's reservation (never refused: admitted sessions finish)."""
        if reserve <= session.reserve or session.closed:
            return
        self._make_room(reserved_bytes - session.reserved_bytes)
        self.reserved += reserved_bytes - session.reserved_bytes
        session.reserve, session.reserved_bytes = reserve, reserved_bytes

    def drop(self, session_id: str) -> bool:
        """Free the session's cache and reservation; False when there was no such session."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        self._release(session)
        return True

    def end(self, session_id: str, keys: Sequence[bytes] | None) -> bool:
        """Drop the session; keep its state in the prefix cache under ``keys`` (its node's
        keys of the chain of the tokens it ran, :func:`prefix_cache.local_keys`) when given."""
        session = self._sessions.get(session_id)
        if not self.drop(session_id):
            return False
        assert session is not None
        kv = session.cache
        held = min(kv.reached, session.position)
        if keys and held >= self.prefix.block and kv.resumable(held):
            kv.truncate(held)
            self.prefix.keep(kv, keys, room=self.kv_budget - self.reserved)
        return True

    def _release(self, session: Session) -> None:
        session.closed = True
        self.reserved -= session.reserved_bytes

    def reap_idle(self) -> list[str]:
        """Drop the sessions whose request is over; returns their ids.

        Those past their plan's deadline, even with a step running (a head that
        keeps stepping does not outlive its request), and those idle longer
        than their plan's idle limit or the store's idle timeout, whichever is
        shorter (a step running is not idle).
        """
        now = self.clock()
        # One pass of plain attribute reads: it runs every second over every session.
        stale = [
            sid
            for sid, session in self._sessions.items()
            if (session.deadline is not None and now >= session.deadline)
            or (session.last_used < now - session.idle_limit and not session.lock.locked())
        ]
        for sid in stale:
            self._release(self._sessions.pop(sid))
        return stale
