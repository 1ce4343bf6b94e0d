"""The total time one request may take, whatever its heads stream.

A head's silence is bounded (:func:`~tracker_app.completions.head_stream.silence_limit`),
but a ``: step`` comment is not silence: a head that streams comments and
never a token would hold its request, and its client, for as long as it
likes. So every request also has a total deadline, ``MESHNET_REQUEST_DEADLINE``
seconds from its start, that nothing a head sends extends. Past it the
request fails (nothing unfinished billed) and the heads still streaming it are blamed:
an honest route finishes any request well within it (ADR-0004, "Deadlines").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from meshnet_site.errors import DomainError, ErrorKind
from routing_app.exclusions.bans import node_ban

logger = logging.getLogger(__name__)


class RequestDeadlineExceeded(DomainError):
    """The request ran past ``MESHNET_REQUEST_DEADLINE``; it is failed, and billed only for
    choices already sent whole (ADR-0004)."""

    kind = ErrorKind.UPSTREAM
    code = "request_deadline_exceeded"


@dataclass(frozen=True)
class RequestDeadline:
    """``seconds`` from ``started`` on ``clock``."""

    seconds: float
    started: float
    clock: Callable[[], float]

    def left(self) -> float:
        """Seconds left (0 once past)."""
        return max(0.0, self.started + self.seconds - self.clock())

    @asynccontextmanager
    async def enforced(
        self, streaming: Mapping[int, str], *, request_id: str
    ) -> AsyncIterator[None]:
        """Cancel the body at the deadline and raise :meth:`passed`'s error instead, blaming
        the heads ``streaming`` names then (choice → head node, kept by the caller)."""
        budget = asyncio.timeout(self.left())
        try:
            async with budget:
                yield
        except TimeoutError:
            if not budget.expired():
                raise
            raise self.passed(set(streaming.values()), request_id=request_id) from None

    def passed(self, heads: set[str], *, request_id: str) -> RequestDeadlineExceeded:
        """The deadline passed with ``heads`` still streaming the request: ban each (its
        next back-off step, as for any failed node), and the error the request ends with."""
        for head in sorted(heads):
            seconds = node_ban(node_id=head)
            logger.warning(
                "request %s: head %s held it past its %g s deadline; banned for %.0f s",
                request_id,
                head,
                self.seconds,
                seconds,
            )
        named = ", ".join(sorted(heads)) or "none"
        return RequestDeadlineExceeded(
            f"The request ran past the deployment's limit of {self.seconds:g} s in all "
            f"without finishing (heads still streaming it: {named}); nothing unfinished is billed"
        )
