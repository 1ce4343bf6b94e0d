"""Waiting for a slot on a busy route: capped, jittered back-off up to a deadline.

A route whose head or hop is at its session cap is waited for, not banned
(ADR-0004, "Deadlines"): each choice of a request retries with back-off
(:func:`busy_retry_delay`) and waits at most ``MESHNET_BUSY_DEADLINE``
seconds in all, over every busy episode and route (:class:`SlotWait`), then
ends in a 503 ``route_busy`` with ``Retry-After`` (:class:`RouteBusyTooLong`).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from meshnet_site.errors import DomainError, ErrorKind

BUSY_RETRY_FIRST_SECONDS = 0.05
BUSY_RETRY_MAX_SECONDS = 1.0
# What a client refused for a busy route is told to wait (Retry-After): a few
# of the tracker's own retry intervals, so the sessions that held the route
# can end; sooner would only join the same queue.
BUSY_RETRY_AFTER_SECONDS = 5


def busy_retry_delay(attempt: int, *, rng: random.Random) -> float:
    """The wait before busy retry ``attempt`` (0 first): 50 ms doubling up to 1 s.

    Each is drawn in the upper half of its step (jitter), so requests waiting
    on one full node do not all retry in the same instant.
    """
    step = min(BUSY_RETRY_MAX_SECONDS, BUSY_RETRY_FIRST_SECONDS * 2 ** min(attempt, 32))
    return step * rng.uniform(0.5, 1.0)


class RouteBusyTooLong(DomainError):
    """The route's nodes stayed at their session cap past the request's busy deadline."""

    kind = ErrorKind.UNAVAILABLE
    code = "route_busy"


@dataclass
class SlotWait:
    """One choice's waiting for slots on busy routes, ``deadline`` seconds at most in all.

    ``clock``, ``sleep`` and ``rng`` are injected (tests freeze time).
    """

    deadline: float
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[None]]
    rng: random.Random
    since: float | None = None  # when the present wait began (None: not waiting)
    waited: float = 0.0  # how long the earlier waits took
    attempt: int = 0  # the next retry

    async def wait(self) -> None:
        """A node of the route is full: wait the next back-off, never past the deadline.

        Raises :class:`RouteBusyTooLong` (503, ``Retry-After``) once
        ``deadline`` seconds of waiting are spent.
        """
        now = self.clock()
        if self.since is None:
            self.since = now
        left = self.deadline - self.waited - (now - self.since)
        if left <= 0:
            raise RouteBusyTooLong(
                f"The route's nodes stayed at their session cap for {self.deadline:g} s; "
                f"retry in {BUSY_RETRY_AFTER_SECONDS} s",
                retry_after=BUSY_RETRY_AFTER_SECONDS,
            )
        await self.sleep(min(left, busy_retry_delay(self.attempt, rng=self.rng)))
        self.attempt += 1

    def over(self) -> None:
        """A slot was found (or the route failed): the next wait starts back-off afresh."""
        if self.since is not None:
            self.waited += self.clock() - self.since
        self.since, self.attempt = None, 0
