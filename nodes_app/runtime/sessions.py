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
ceiling remains for operators and tests that want a count. Sessions left
idle longer than the timeout are forgotten.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nodes_app.runtime.errors import RuntimeRequestError
from nodes_app.runtime.sampling import TokenPicker

# Far longer than a head waits on each hop for one step (the step timeout,
# 30 s by default; a long prefill gets more, protocol.limits.step_time_limit): a live
# session is never reaped between two of its steps.
IDLE_TIMEOUT_SECONDS = 600.0


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
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The store's clock, so that idle time is measured on the clock that reaps.
    clock: Callable[[], float] = time.monotonic
    last_used: float = field(init=False)

    def __post_init__(self) -> None:
        self.last_used = self.clock()

    def touch(self) -> None:
        self.last_used = self.clock()

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
    ) -> None:
        self.kv_budget = kv_budget
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self.reserved = 0

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
    ) -> Session:
        """Admit a session reserving ``reserved_bytes`` (for ``reserve`` positions), or 503."""
        if session_id in self._sessions:
            raise RuntimeRequestError(
                f"session {session_id} already exists: position 0 starts a new session",
                code="session_exists",
            )
        if self.max_sessions is not None and len(self._sessions) >= self.max_sessions:
            raise _busy(
                f"node is at its cap of {self.max_sessions} concurrent sessions; retry later"
            )
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
            clock=self._clock,
        )
        self._sessions[session_id] = session
        self.reserved += reserved_bytes
        return session

    def extend(self, session: Session, *, reserve: int, reserved_bytes: int) -> None:
        """Grow a live session's reservation (never refused: admitted sessions finish)."""
        if reserve <= session.reserve or session.closed:
            return
        self.reserved += reserved_bytes - session.reserved_bytes
        session.reserve, session.reserved_bytes = reserve, reserved_bytes

    def drop(self, session_id: str) -> bool:
        """Free the session's cache and reservation; False when there was no such session."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        self._release(session)
        return True

    def _release(self, session: Session) -> None:
        session.closed = True
        self.reserved -= session.reserved_bytes

    def reap_idle(self) -> list[str]:
        """Drop sessions idle for longer than the timeout; returns their ids."""
        deadline = self._clock() - self.idle_timeout
        stale = [
            sid
            for sid, session in self._sessions.items()
            if session.last_used < deadline and not session.lock.locked()
        ]
        for sid in stale:
            self._release(self._sessions.pop(sid))
        return stale
