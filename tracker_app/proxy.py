"""The chat proxy: run one client request along a learned route, with failover.

``ChatProxy.run()`` chooses the route, streams the head node's frames
(:mod:`tracker_app.head_stream`; the contract is :mod:`nodes_app.protocol`)
and yields the client's ``chat.completion.chunk`` server-sent events as
tokens arrive. Along the way it emits the console events of the Call wall,
and at the end it records the request, bills it
(:func:`tracker_app.billing.request_work`) and teaches the router the
route's speed.

Per token (the hot path) it only counts the token ids, writes the client's
event from a per-request template (:class:`~tracker_app.chat.ContentEvents`)
and marks progress changed: no database, no channel layer. Progress reaches
the dashboards through :class:`~tracker_app.progress.ProgressThrottle`, at
most once per :data:`PROGRESS_INTERVAL_SECONDS`, the final count with
``proxy complete``.

If a hop dies mid-generation the node is banned with exponential back-off
(:mod:`routing_app.bans`; a success clears it), a new route is chosen
without it, and generation resumes on the new head by replaying the prompt
plus every token already produced: the client's stream goes on with no gap
and no repeated token.

Deadlines (ADR-0004): a request waits for a busy route's slot at most
``MESHNET_BUSY_DEADLINE`` seconds in all, retrying with capped, jittered
exponential back-off, then ends in a 503 ``route_busy`` with ``Retry-After``;
a head silent past :func:`~tracker_app.head_stream.silence_limit` (from
``MESHNET_HOP_STEP_TIMEOUT``) has failed, like a hop the head reports hung.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import httpx
from django.conf import settings
from django.utils import timezone

from meshnet_site.database import database_call
from meshnet_site.errors import DomainError, ErrorKind, http_error
from nodes_app.models import LanguageModel
from nodes_app.plans import plan_sign
from nodes_app.protocol import ChunkFrame, GenerateRequest, PlanHop, Usage, sse_event
from routing_app.bans import node_ban, node_bans_clear
from routing_app.choice import RouteDecision
from routing_app.planner import Hop
from routing_app.services import route_sample_record, route_select, route_session_close
from tracker_app import accounting, console
from tracker_app.billing import request_work
from tracker_app.chat import ChatParams, ContentEvents, completion_chunk
from tracker_app.head_stream import HopFailure, RouteBusy, head_stream, silence_limit
from tracker_app.models import ApiKey
from tracker_app.progress import ProgressThrottle
from tracker_app.prompt_tokens import PromptCount, prompt_tokens_count

logger = logging.getLogger(__name__)

MAX_FAILOVERS = 3
# A route whose head or hop is at its session cap is waited for, not banned:
# retry with back-off (busy_retry_delay), up to MESHNET_BUSY_DEADLINE in all.
BUSY_RETRY_FIRST_SECONDS = 0.05
BUSY_RETRY_MAX_SECONDS = 1.0
# What a client refused for a busy route is told to wait (Retry-After): a few
# of the tracker's own retry intervals, so the sessions that held the route
# can end; sooner would only join the same queue.
BUSY_RETRY_AFTER_SECONDS = 5
# At most one progress event per request this often (leading and trailing edge).
PROGRESS_INTERVAL_SECONDS = 0.5


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


class UpstreamFailed(DomainError):
    """A node failed and no failover was allowed (pinned route, or too many already)."""

    kind = ErrorKind.UPSTREAM
    code = "upstream_failed"


# Requests this tracker process is streaming from each head: the queue a new
# request joins there, as far as this tracker can see.
_in_flight: Counter[str] = Counter()


@dataclass
class Segment:
    """The part of one request served by one route."""

    decision: RouteDecision
    replayed: int  # tokens produced earlier and prefilled again on this route
    started: float
    produced: int = 0

    @property
    def signature(self) -> str:
        return self.decision.plan.signature

    @property
    def hops(self) -> tuple[Hop, ...]:
        return self.decision.plan.hops


@dataclass
class Outcome:
    texts: list[str] = field(default_factory=list)  # the completion's text, chunk by chunk
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: DomainError | None = None
    segments: list[Segment] = field(default_factory=list)

    @property
    def content(self) -> str:
        return "".join(self.texts)

    @property
    def usage(self) -> dict[str, int]:
        return Usage(self.prompt_tokens, self.completion_tokens).to_json()


class ChatProxy:
    """One client request. Iterate ``run()``; read ``outcome`` and ``meshnet`` after."""

    def __init__(
        self,
        *,
        params: ChatParams,
        api_key: ApiKey,
        model: LanguageModel,
        client: httpx.AsyncClient,
        fee_share: Decimal,
        emit: Callable[..., Awaitable[Any]] = console.console_emit,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        busy_deadline: float | None = None,
        step_timeout: float | None = None,
        progress_interval: float = PROGRESS_INTERVAL_SECONDS,
    ) -> None:
        """``busy_deadline`` and ``step_timeout`` default to MESHNET_BUSY_DEADLINE and
        MESHNET_HOP_STEP_TIMEOUT; ``clock``, ``sleep`` and ``rng`` drive the busy back-off;
        ``progress_interval``: the least time between two progress events."""
        self.params = params
        self.api_key = api_key
        self.model = model
        self.client = client
        self.fee_share = fee_share
        self.emit = emit
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.busy_deadline = (
            settings.MESHNET_BUSY_DEADLINE if busy_deadline is None else busy_deadline
        )
        self.step_timeout = (
            settings.MESHNET_HOP_STEP_TIMEOUT if step_timeout is None else step_timeout
        )
        # The record's id is fixed before it exists, so a cancel that races
        # with its creation still finds it (DB calls run in order on one thread).
        self.request_uuid = uuid.uuid4()
        self.request_id = str(self.request_uuid)
        self.completion_id = f"chatcmpl-{self.request_uuid.hex}"
        self.created = int(time.time())
        self.outcome = Outcome()
        self.token_ids: list[int] = []
        self.prompt = PromptCount(tokens=0, exact=False)
        self._started = clock()
        self._first_token_at: float | None = None
        self._content_events = ContentEvents.of(
            completion_id=self.completion_id, created=self.created, model=params.model
        )
        self._progress = ProgressThrottle(interval=progress_interval, report=self._report_progress)
        # Waiting for a slot: since when (this time), how long before, which retry.
        self._busy_since: float | None = None
        self._busy_waited = 0.0
        self._busy_attempt = 0

    @property
    def meshnet(self) -> dict[str, Any]:
        """The ``meshnet`` extension field: the route serving the request now."""
        return self.outcome.segments[-1].decision.to_dict() if self.outcome.segments else {}

    async def start(self) -> None:
        """Count the prompt, choose the first route and open the request record.

        Raises a ``DomainError`` (a prompt the model refuses, no route, bad
        pinned route) before anything is streamed, so the client gets a plain
        error response.
        """
        # Tokenising takes a fraction of a millisecond to a few; never on the event loop.
        self.prompt = await asyncio.to_thread(
            prompt_tokens_count,
            weight_source=self.model.weight_source,
            messages=self.params.messages,
            max_tokens=self.params.max_tokens,
        )
        decision = await database_call(route_select)(model=self.model, pinned=self.params.route)
        await database_call(accounting.chat_request_open)(
            request_id=self.request_uuid,
            api_key=self.api_key,
            model=self.model,
            stream=self.params.stream,
            now=timezone.now(),
        )
        self._started = self.clock()
        await self._use(decision, replayed=0)

    async def run(self) -> AsyncIterator[bytes]:
        """The client's server-sent events (``data: …``, ``[DONE]`` not included):
        chunks with the role first, text as it comes, ``finish_reason`` and usage last.

        A failure with no route left ends the stream with an ``{"error": …}``
        event; the request is then recorded failed and not charged.
        """
        yield sse_event(
            completion_chunk(
                completion_id=self.completion_id,
                created=self.created,
                model=self.params.model,
                delta={"role": "assistant", "content": ""},
                meshnet=self.meshnet,
            )
        )
        failovers = 0
        try:
            while True:
                try:
                    async for event in self._segment():
                        yield event
                    break
                except RouteBusy:
                    await self._wait_for_slot()
                except HopFailure as failure:
                    failovers += 1
                    await self._fail_over(failure, exhausted=failovers > MAX_FAILOVERS)
        except DomainError as error:
            self.outcome.error = error
            await self.fail(error.message)
            yield sse_event(http_error(error).body)
            return
        finally:
            # Torn down by its client (cancelled): no progress outlives the request.
            self._progress.cancel()
        await self._finish_completed()
        yield sse_event(
            completion_chunk(
                completion_id=self.completion_id,
                created=self.created,
                model=self.params.model,
                delta={},
                finish_reason=self.outcome.finish_reason,
                usage=self.outcome.usage,
            )
        )

    async def fail(self, message: str, *, cancelled: bool = False) -> None:
        """Record the request failed (or cancelled by the client): never charged.

        Safe to call on any exit path and more than once: only the first call
        that finds the request still processing changes it and tells the
        console.
        """
        failed = await database_call(accounting.chat_request_fail)(
            request_id=self.request_uuid, error=message, now=timezone.now(), cancelled=cancelled
        )
        if failed:
            # The Call wall keeps the last count a failed request reached.
            await self._progress.close(flush=True)
            await self.emit(console.ERROR, self.request_id, message=message)

    async def _wait_for_slot(self) -> None:
        """A node of the route is full: wait with back-off, up to the busy deadline in all.

        Raises :class:`RouteBusyTooLong` (503, ``Retry-After``) once the
        request has waited ``busy_deadline`` seconds for slots, over all its
        routes; no wait runs past the deadline.
        """
        now = self.clock()
        if self._busy_since is None:
            self._busy_since = now
        left = self.busy_deadline - self._busy_waited - (now - self._busy_since)
        if left <= 0:
            raise RouteBusyTooLong(
                f"The route's nodes stayed at their session cap for {self.busy_deadline:g} s; "
                f"retry in {BUSY_RETRY_AFTER_SECONDS} s",
                retry_after=BUSY_RETRY_AFTER_SECONDS,
            )
        await self.sleep(min(left, busy_retry_delay(self._busy_attempt, rng=self.rng)))
        self._busy_attempt += 1

    def _busy_over(self) -> None:
        """A slot was found (or the route failed): the next wait starts back-off afresh."""
        if self._busy_since is not None:
            self._busy_waited += self.clock() - self._busy_since
        self._busy_since, self._busy_attempt = None, 0

    async def _use(self, decision: RouteDecision, *, replayed: int) -> None:
        self.outcome.segments.append(
            Segment(decision=decision, replayed=replayed, started=self.clock())
        )
        await database_call(accounting.chat_request_route)(
            request_id=self.request_uuid,
            signature=decision.plan.signature,
            mode=str(decision.mode),
        )
        await self.emit(
            console.ROUTE_SELECTED,
            self.request_id,
            model=self.model.key,
            mode=str(decision.mode),
            signature=decision.plan.signature,
            hops=decision.plan.to_dict(),
        )

    async def _segment(self) -> AsyncIterator[bytes]:
        """Stream the current route's tokens; raise HopFailure if one of its nodes fails."""
        segment = self.outcome.segments[-1]
        plan = segment.decision.plan
        # Signed afresh for every send: a retry or a failover opens new sessions.
        request = plan_sign(
            GenerateRequest(
                request_id=self.request_id,
                model=plan.model_key,
                hops=tuple(
                    PlanHop(hop.node_id, hop.endpoint, hop.start_layer, hop.end_layer)
                    for hop in plan.hops
                ),
                messages=self.params.messages,
                max_tokens=self.params.max_tokens,
                sampling=self.params.sampling,
                stop=self.params.stop,
                resume_token_ids=list(self.token_ids),
            )
        )

        async def connected() -> None:
            # The route's clock starts. Waiting for a slot is over only at the first
            # token: a downstream hop may still answer busy (hop_busy) after the
            # head's 200 and its prefill, and the back-off must keep growing then.
            segment.started = self.clock()
            await self.emit(console.CONNECTED, self.request_id, endpoint=plan.head.endpoint)

        _in_flight[plan.head.endpoint] += 1
        try:
            frames = head_stream(
                client=self.client,
                request=request,
                silence=silence_limit(
                    step_timeout=self.step_timeout,
                    hops=len(plan.hops),
                    positions=self.prompt.tokens + len(self.token_ids),
                ),
                on_connected=connected,
                prompt_checked=self.prompt.exact,
            )
            async with aclosing(frames):
                async for frame in frames:
                    if frame.token_ids:  # the whole route took the step: a slot at last
                        self._busy_over()
                        self._progress.changed()
                    event = self._absorb(frame, segment)
                    if event is not None:
                        yield event
        finally:
            _in_flight[plan.head.endpoint] -= 1
            # However the stream ended, it is no longer load on the route.
            route_session_close(decision=segment.decision)

    def _absorb(self, frame: ChunkFrame, segment: Segment) -> bytes | None:
        """Take one head frame; return the client's event it becomes, if any."""
        self.token_ids += frame.token_ids
        segment.produced += len(frame.token_ids)
        if frame.usage is not None:
            # The tracker counts prompt and completion tokens itself; nodes report, not bill.
            self._check_usage(frame.usage, segment)
            self.outcome.prompt_tokens = self.prompt.billable(frame.usage.prompt_tokens)
            self.outcome.completion_tokens = len(self.token_ids)
        if frame.finish_reason:
            self.outcome.finish_reason = frame.finish_reason
        if not frame.content:
            return None
        if self._first_token_at is None:
            self._first_token_at = self.clock()
        self.outcome.texts.append(frame.content)
        return self._content_events.event(frame.content)

    def _check_usage(self, usage: Usage, segment: Segment) -> None:
        """Log a head whose usage is not what the tracker counted (it is not billed)."""
        produced = len(self.token_ids)
        if self.prompt.agrees(usage.prompt_tokens) and usage.completion_tokens == produced:
            return
        logger.warning(
            "request %s: head %s reported %d prompt and %d completion tokens; the tracker "
            "counted %s%d prompt and %d completion tokens and bills its own count",
            self.request_id,
            segment.decision.plan.head.node_id,
            usage.prompt_tokens,
            usage.completion_tokens,
            "" if self.prompt.exact else "at most ",
            self.prompt.tokens,
            produced,
        )

    async def _report_progress(self) -> None:
        """Tell the console how far the request is (run by the throttle, off the relay)."""
        elapsed = self.clock() - self._started
        await self.emit(
            console.PROGRESS,
            self.request_id,
            tokens=len(self.token_ids),
            tokens_per_second=round(len(self.token_ids) / elapsed, 2) if elapsed > 0 else None,
            queue=_in_flight[self.outcome.segments[-1].decision.plan.head.endpoint] - 1,
        )

    async def _fail_over(self, failure: HopFailure, *, exhausted: bool) -> None:
        self._busy_over()
        ban = node_ban(node_id=failure.node_id)
        logger.warning(
            "request %s: hop %s failed (%s); banned for %.0f s",
            self.request_id,
            failure.node_id,
            failure.message,
            ban,
        )
        if exhausted or self.params.route is not None:
            why = "pinned route" if self.params.route is not None else "too many failovers"
            raise UpstreamFailed(
                f"Node {failure.node_id} failed mid-generation ({failure.message}); "
                f"no failover ({why})"
            )
        decision = await database_call(route_select)(model=self.model)
        await self._use(decision, replayed=len(self.token_ids))

    async def _finish_completed(self) -> None:
        # ``proxy complete`` below carries the final count: no progress after it.
        await self._progress.close()
        now = self.clock()
        prompt = self.outcome.prompt_tokens
        work = request_work(prompt_tokens=prompt, routes=self.outcome.segments)
        elapsed = now - self._started
        tps = self.outcome.completion_tokens / elapsed if elapsed > 0 else None
        ttft = (self._first_token_at - self._started) * 1000 if self._first_token_at else None
        await database_call(accounting.chat_request_complete)(
            request_id=self.request_uuid,
            model=self.model,
            prompt_tokens=prompt,
            completion_tokens=self.outcome.completion_tokens,
            finish_reason=self.outcome.finish_reason,
            time_to_first_token_ms=ttft,
            tokens_per_second=tps,
            work=work,
            fee_share=self.fee_share,
            now=timezone.now(),
        )
        last = self.outcome.segments[-1]
        route_sample_record(
            decision=last.decision, output_tokens=last.produced, elapsed_seconds=now - last.started
        )
        node_bans_clear(node_ids=last.decision.plan.node_ids)
        await self.emit(
            console.COMPLETE,
            self.request_id,
            signature=last.decision.plan.signature,
            completion_tokens=self.outcome.completion_tokens,
            tokens_per_second=round(tps, 2) if tps else None,
            finish_reason=self.outcome.finish_reason,
        )
