"""A request's end: what it owes, recorded once, whichever way it ended.

:class:`RequestFinish` ends one request the proxy ran, and ends it once:
completed and billed when its whole answer was generated (to the end even if
its client leaves meanwhile: the answer is owed); cancelled by a client that
left, charged for the tokens it was sent, as OpenAI bills; failed by the
network after some choices were sent whole, billed for those only; or failed
and never charged. However it ended, none of its streams is load on a route
any more, its key's share is given back, the Call wall's progress stops and
the console is told (:mod:`~tracker_app.completions.console`). The records
themselves are :class:`~tracker_app.completions.recording.RequestRecord`'s;
what each end is billed for is a
:class:`~tracker_app.completions.recording.Completion`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from meshnet_site.errors import is_database_outage
from routing_app.policies.choice import RouteDecision
from routing_app.services import route_session_close
from tracker_app.api_keys.in_flight import KeyShare
from tracker_app.completions import console
from tracker_app.completions.generation import Generation
from tracker_app.completions.progress import ProgressThrottle
from tracker_app.completions.recording import Completion, RequestRecord

logger = logging.getLogger(__name__)


class RequestFinish:
    """How one request ends: :meth:`completed` once its whole answer was generated,
    :meth:`network_failed` or :meth:`fail` otherwise; :meth:`release_routes` on any exit.

    ``started`` and ``first_token_at`` (the clock's readings) are what the bill's
    timings count from; the proxy sets them as the request runs.
    """

    def __init__(
        self,
        *,
        record: RequestRecord,
        share: KeyShare,
        progress: ProgressThrottle,
        emit: Callable[..., Awaitable[Any]],
        clock: Callable[[], float],
        n: int,
    ) -> None:
        """``share``: the request's lease on its key's share; ``progress``: the Call
        wall's, closed at the end; ``emit``: where console events go; ``n``: choices per
        prompt."""
        self.record, self.share, self.progress = record, share, progress
        self.emit, self.clock, self.n = emit, clock, n
        self.request_id = str(record.request_id)
        self.started = clock()
        self.first_token_at: float | None = None
        # Recording the request completed and billed (``completed``), once begun, and
        # whether its client left meanwhile (nobody awaits it then).
        self._completion: asyncio.Future[Completion | None] | None = None
        self._left_while_completing = False
        # The route chosen for a request its client left while it was being admitted.
        self._abandoned_route: RouteDecision | None = None

    def route_abandoned(self, decision: RouteDecision) -> None:
        """``decision``'s route was chosen for the request, which was torn down before any
        choice ran on it: :meth:`release_routes` lets it go."""
        self._abandoned_route = decision

    def release_routes(self, generations: Sequence[Generation]) -> None:
        """However the request ended, none of its streams (``generations``) is load on a
        route now (idempotent)."""
        if self._abandoned_route is not None:  # chosen for a request torn down meanwhile
            route_session_close(decision=self._abandoned_route)
        for generation in generations:
            if generation.segments:
                route_session_close(decision=generation.segments[-1].decision)

    async def completed(self, generations: Sequence[Generation]) -> Completion:
        """Record the request completed and billed, learn its route's speed and tell the
        console, to the end even if the client leaves meanwhile (shielded: the whole
        answer was generated, so it is owed)."""
        self._completion = asyncio.ensure_future(self._complete_owed(generations))
        completion = await asyncio.shield(self._completion)
        # None only when the client left meanwhile: then nobody is awaiting here.
        assert completion is not None
        return completion

    async def fail(
        self, message: str, generations: Sequence[Generation], *, cancelled: bool = False
    ) -> None:
        """Record the request failed, never charged, or cancelled by its client
        (``cancelled``): then charged for the tokens it was sent, as OpenAI bills, and
        the nodes paid for their work (nothing if it was sent none: a whole answer
        not yet sent, a tool call still held back, or a stream before its first token).

        Safe to call on any exit path and more than once: only the first call
        that finds the request still processing changes it and tells the
        console. A request that failed before its choices ran (its client gone
        while the headers were sent) stops counting as load on its routes here.
        A request whose completion is being recorded (its whole answer was
        generated; the client left while the usage was billed) is left to it.
        """
        self.release_routes(generations)
        await asyncio.shield(self.share.release())
        if self._completion is not None and not self._completion.done():
            self._left_while_completing = True
            return
        if cancelled and any(g.delivered for g in generations):
            await self._record_left(message, generations)
            return
        await self._record_failed(message, cancelled=cancelled)

    async def network_failed(self, message: str, generations: Sequence[Generation]) -> None:
        """Record the request failed by the network: never charged, unless some of its
        choices were sent whole before (``n > 1``, streamed). Those are billed, as
        answers delivered; the choices the failure cut are not, as it is no fault of
        the client's (partly served)."""
        served = [g for g in generations if g.delivered_whole]
        if not served:
            await self.fail(message, generations)
            return
        self.release_routes(generations)
        if await self.record.partly_served(self._completion_of(served), message=message):
            await self.progress.close(flush=True)
            await self.emit(console.ERROR, self.request_id, message=message)

    async def _record_left(self, message: str, generations: Sequence[Generation]) -> None:
        """Bill a streamed request its client left: every token sent, each prompt once."""
        for generation in generations:
            generation.prompt_settled()
        completion = self._completion_of(generations, sent_only=True)
        if await self.record.left(completion, message=message):
            await self.progress.close(flush=True)
            await self.emit(console.ERROR, self.request_id, message=message)

    def _completion_of(
        self, generations: Sequence[Generation], *, sent_only: bool = False
    ) -> Completion:
        """What ``generations`` are billed for now (:meth:`Completion.of`)."""
        first_token_at = self.first_token_at
        return Completion.of(
            generations,
            n=self.n,
            elapsed=self.clock() - self.started,
            first_token_after=None if first_token_at is None else first_token_at - self.started,
            sent_only=sent_only,
        )

    async def _record_failed(self, message: str, *, cancelled: bool) -> None:
        if await self.record.fail(message, cancelled=cancelled):
            # The Call wall keeps the last count a failed request reached.
            await self.progress.close(flush=True)
            await self.emit(console.ERROR, self.request_id, message=message)

    async def _complete_owed(self, generations: Sequence[Generation]) -> Completion | None:
        """:meth:`_complete`; if it fails after the client left, nobody awaits it: the
        request ends here as the consumer would have ended it."""
        try:
            return await self._complete(generations)
        except Exception as error:
            if not self._left_while_completing:
                raise
            if is_database_outage(error):  # open until the abandoned-request sweep
                logger.warning(
                    "request %s: its client left and the database is unavailable",
                    self.request_id,
                    exc_info=True,
                )
            else:
                logger.exception("request %s: failed inside the tracker", self.request_id)
                await self._record_failed(
                    "the tracker failed to serve this request", cancelled=False
                )
            return None

    async def _complete(self, generations: Sequence[Generation]) -> Completion:
        # ``proxy complete`` below carries the final count: no progress after it.
        await self.progress.close()
        now = self.clock()
        completion = self._completion_of(generations)
        try:
            await self.record.complete(
                completion, generations=generations, now=now, share=self.share
            )
        finally:
            await asyncio.shield(self.share.release())  # nothing left once it went with it
        tps = completion.tokens_per_second
        await self.emit(
            console.COMPLETE,
            self.request_id,
            signature=generations[0].segments[-1].decision.plan.signature,
            completion_tokens=completion.completion_tokens,
            tokens_per_second=round(tps, 2) if tps else None,
            finish_reason=completion.finish_reason,
        )
        return completion
