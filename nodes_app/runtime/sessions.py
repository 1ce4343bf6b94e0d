"""Per-session KV caches on a node: created on a session's first step, freed at its end.

A session belongs to one generation and one layer range. Its steps are
serialised by its lock; positions must follow each other exactly, so a lost or
repeated step is refused instead of corrupting the cache. The store has a cap
(a full node answers 503 rather than running out of memory) and forgets
sessions left idle longer than the timeout.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nodes_app.runtime.errors import RuntimeRequestError

# Far longer than a head waits on each hop for one step (the step timeout,
# 30 s by default; a long prefill gets more, protocol.step_time_limit): a live
# session is never reaped between two of its steps.
IDLE_TIMEOUT_SECONDS = 600.0


@dataclass
class Session:
    session_id: str
    start: int
    end: int
    cache: Any
    position: int = 0
    generator: Any = None
    # SHA-256 of the capability that opened it; None (dev-open): anyone may step it.
    capability: bytes | None = None
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


class SessionStore:
    def __init__(
        self,
        *,
        max_sessions: int,
        idle_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._sessions: dict[str, Session] = {}

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
        capability: bytes | None = None,
    ) -> Session:
        if session_id in self._sessions:
            raise RuntimeRequestError(
                f"session {session_id} already exists: position 0 starts a new session",
                code="session_exists",
            )
        if len(self._sessions) >= self.max_sessions:
            raise RuntimeRequestError(
                f"node is at its cap of {self.max_sessions} concurrent sessions; retry later",
                code="node_busy",
                status=503,
                error_type="server_error",
            )
        session = Session(
            session_id=session_id,
            start=start,
            end=end,
            cache=cache,
            capability=capability,
            clock=self._clock,
        )
        self._sessions[session_id] = session
        return session

    def drop(self, session_id: str) -> bool:
        """Free the session's cache; False when there was no such session."""
        return self._sessions.pop(session_id, None) is not None

    def reap_idle(self) -> list[str]:
        """Drop sessions idle for longer than the timeout; returns their ids."""
        deadline = self._clock() - self.idle_timeout
        stale = [
            sid
            for sid, session in self._sessions.items()
            if session.last_used < deadline and not session.lock.locked()
        ]
        for sid in stale:
            del self._sessions[sid]
        return stale
