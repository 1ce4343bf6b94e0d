"""The completion proxy: run one client request along a learned route, with failover.

``ChatProxy`` serves both completion endpoints (chat and legacy text): it
chooses the route, runs each of the request's choices (``n`` for each prompt,
:class:`~tracker_app.completions.generation.Generation`) at once on it, streams the head
nodes' frames (:mod:`tracker_app.completions.head_stream`; the contract is
:mod:`nodes_app.protocol`) and yields the client's server-sent events in the
endpoint's shape (:mod:`tracker_app.completions.answers`) as tokens arrive. Along the way
it emits the console events of the Call wall, and at the end it records the
request, bills it (one unit of work per hop of every route any choice used,
:mod:`tracker_app.billing.pricing`) and teaches the router the route's speed.

Per token (the hot path) it only counts the token ids, writes the client's
event from a per-request template (:class:`~tracker_app.completions.answers.TextEvents`)
and marks progress changed: no database, no channel layer. Progress reaches
the dashboards through :class:`~tracker_app.completions.progress.ProgressThrottle`, at
most once per :data:`PROGRESS_INTERVAL_SECONDS`, the final count with
``proxy complete``.

If a hop dies mid-generation the node is banned with exponential back-off
(:mod:`routing_app.bans`; a success clears it) — once for the choices that
were on it together, whose streams all fail at once —, a new route is chosen
without it for each failed choice, and its generation resumes on the new head by
replaying the prompt plus every token already produced: the client's stream
goes on with no gap and no repeated token. Each choice fails over on its own.

Deadlines (ADR-0004): a choice waits for a busy route's slot at most
``MESHNET_BUSY_DEADLINE`` seconds in all, retrying with capped, jittered
exponential back-off (:mod:`tracker_app.completions.slots`), then the request ends in a
503 ``route_busy`` with ``Retry-After``; a head silent past
:func:`~tracker_app.completions.head_stream.silence_limit` (from ``MESHNET_HOP_STEP_TIMEOUT``)
has failed, like a hop the head reports hung.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from decimal import Decimal
from typing import Any

import httpx
from django.conf import settings
from django.utils import timezone

from meshnet_site.database import database_call, through_outage
from meshnet_site.errors import DomainError, ErrorKind, http_error, is_database_outage
from nodes_app.models import LanguageModel
from nodes_app.plans import plan_sign
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.signed_plan import PlanHop
from nodes_app.protocol.sse import sse_event
from nodes_app.protocol.usage import Usage
from routing_app.bans import node_ban, node_bans_clear
from routing_app.choice import RouteDecision
from routing_app.services import (
    route_choose,
    route_sample_record,
    route_session_close,
    route_session_open,
    route_session_touch,
)
from tracker_app.billing.pricing import work_merged
from tracker_app.completions import console, recording
from tracker_app.completions.answers import AnswerKind
from tracker_app.completions.chat import ChatAnswer
from tracker_app.completions.generation import Generation, Piece, Segment
from tracker_app.completions.head_stream import HopFailure, RouteBusy, head_stream, silence_limit
from tracker_app.completions.interleaving import interleaved
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.progress import ProgressThrottle
from tracker_app.completions.prompt_tokens import echo_check, prompt_tokens_count
from tracker_app.completions.slots import SlotWait
from tracker_app.models import ApiKey

logger = logging.getLogger(__name__)

MAX_FAILOVERS = 3
# At most one progress event per request this often (leading and trailing edge).
PROGRESS_INTERVAL_SECONDS = 0.5


class UpstreamFailed(DomainError):
    """A node failed and no failover was allowed (pinned route, or too many already)."""

    kind = ErrorKind.UPSTREAM
    code = "upstream_failed"


# The requests this tracker process is streaming from each head, with their
# streams (a request's choices each have one): the queue a new request joins
# there, as far as this tracker can see. Head endpoint → request id → streams.
_in_flight: defaultdict[str, Counter[str]] = defaultdict(Counter)


def _stream_ended(endpoint: str, request_id: str) -> None:
    streams = _in_flight[endpoint]
    streams[request_id] -= 1
    if streams[request_id] <= 0:
        del streams[request_id]
    if not streams:
        del _in_flight[endpoint]


def _queue_ahead(endpoint: str, request_id: str) -> int:
    """The other requests streaming from ``endpoint`` (a request's own choices are not
    its queue)."""
    return sum(1 for other in _in_flight.get(endpoint, {}) if other != request_id)


class ChatProxy:
    """One client request of either completion endpoint, its ``n`` choices (each prompt's)
    generated at once. Iterate ``run()``; read ``generations``, ``usage``, ``error`` and
    ``meshnet`` after."""

    def __init__(
        self,
        *,
        params: GenerationParams,
        api_key: ApiKey,
        model: LanguageModel,
        client: httpx.AsyncClient,
        fee_share: Decimal,
        answer: AnswerKind = ChatAnswer,
        emit: Callable[..., Awaitable[Any]] = console.console_emit,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        busy_deadline: float | None = None,
        step_timeout: float | None = None,
        progress_interval: float = PROGRESS_INTERVAL_SECONDS,
    ) -> None:
        """``answer``: the endpoint's answer shape; ``busy_deadline`` and ``step_timeout``
        default to MESHNET_BUSY_DEADLINE and MESHNET_HOP_STEP_TIMEOUT; ``clock``, ``sleep``
        and ``rng`` drive the busy back-off; ``progress_interval``: the least time between
        two progress events."""
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
        self.completion_id = f"{answer.id_prefix}{self.request_uuid.hex}"
        self.created = int(time.time())
        self.answer = answer(completion_id=self.completion_id, created=self.created, params=params)
        self.generations: list[Generation] = []
        self.error: DomainError | None = None
        self._started = clock()
        self._first_token_at: float | None = None
        self._progress = ProgressThrottle(interval=progress_interval, report=self._report_progress)
        # When this request last banned each node: the choices sharing a route all fail
        # when one of its nodes dies, and that is one failure of the node, not n.
        self._banned_at: dict[str, float] = {}
        # Recording the request completed and billed (``_finish_completed``), once begun,
        # and whether its client left meanwhile (nobody awaits it then).
        self._completion: asyncio.Future[None] | None = None
        self._left_while_completing = False

    @property
    def meshnet(self) -> dict[str, Any]:
        """The ``meshnet`` extension field: the route serving the (first) choice now."""
        first = self.generations[0] if self.generations else None
        return first.route.to_dict() if first is not None and first.segments else {}

    @property
    def prompt_tokens(self) -> int:
        """The prompt tokens billed: each prompt once, however many choices it has."""
        return sum(g.prompt_tokens for g in self.generations if g.choice % self.params.n == 0)

    @property
    def completion_tokens(self) -> int:
        """Every choice's tokens: what the client is billed per output token."""
        return sum(len(g.token_ids) for g in self.generations)

    @property
    def usage(self) -> dict[str, int]:
        return Usage(self.prompt_tokens, self.completion_tokens).to_json()

    async def start(self) -> None:
        """Count the prompts, choose the route of every choice and open the request record.

        Raises a ``DomainError`` (a prompt the model refuses, no route, bad
        pinned route) before anything is streamed, so the client gets a plain
        error response.
        """
        counts = [
            # Tokenising takes a fraction of a millisecond to a few; never on the event loop.
            await asyncio.to_thread(
                prompt_tokens_count,
                weight_source=self.model.weight_source,
                prompt=prompt,
                max_tokens=self.params.max_tokens,
            )
            for prompt in self.params.prompts
        ]
        if self.params.prompt_scored:
            for count in counts:
                echo_check(prompt=count, top_logprobs=self.params.top_logprobs)
        decision = await database_call(route_choose)(model=self.model, pinned=self.params.route)
        try:
            await database_call(recording.chat_request_open)(
                request_id=self.request_uuid,
                api_key=self.api_key,
                model=self.model,
                stream=self.params.stream,
                now=timezone.now(),
            )
            self._started = self.clock()
            self.generations = [
                Generation(
                    choice=choice,
                    prompt=self.params.prompt_of(choice),
                    prompt_count=counts[choice // self.params.n],
                    sampling=self.params.sampling(choice),
                )
                for choice in range(self.params.choices)
            ]
            await self._use(decision, self.generations)
        except BaseException:
            # Never streamed: the route's load must not count it.
            route_session_close(decision=decision)
            raise

    async def run(self) -> AsyncIterator[bytes]:
        """The client's server-sent events (``data: …``, ``[DONE]`` not included) in the
        answer's shape: its opening, text as it comes, each choice's end, usage last.

        A failure with no route left ends the stream with an ``{"error": …}``
        event; the request is then recorded failed and not charged.
        """
        for event in self.answer.opening(self.meshnet):
            yield event
        unfinished, last = len(self.generations), None
        try:
            async for piece in interleaved([self._generate(g) for g in self.generations]):
                if piece.finish_reason is None:
                    yield self.answer.piece(piece)
                    continue
                unfinished -= 1
                if unfinished:
                    yield self.answer.finish(piece.choice, piece.finish_reason, None)
                else:
                    last = piece  # ends the answer with usage, once it is billed
        except DomainError as error:
            self.error = error
            await self.fail(error.message)
            yield sse_event(http_error(error).body)
            return
        finally:
            # Torn down by its client (cancelled): no progress outlives the request.
            self._progress.cancel()
            self._release_routes()
        await self._finish_completed()
        assert last is not None and last.finish_reason is not None
        yield self.answer.finish(last.choice, last.finish_reason, self.usage)

    async def fail(self, message: str, *, cancelled: bool = False) -> None:
        """Record the request failed (or cancelled by the client): never charged.

        Safe to call on any exit path and more than once: only the first call
        that finds the request still processing changes it and tells the
        console. A request that failed before ``run()`` began (its client gone
        while the headers were sent) stops counting as load on its routes here.
        A request whose completion is being recorded (its whole answer was
        generated; the client left while the usage was billed) is left to it.
        """
        self._release_routes()
        if self._completion is not None and not self._completion.done():
            self._left_while_completing = True
            return
        await self._record_failed(message, cancelled=cancelled)

    async def _record_failed(self, message: str, *, cancelled: bool) -> None:
        failed = await database_call(recording.chat_request_fail)(
            request_id=self.request_uuid, error=message, now=timezone.now(), cancelled=cancelled
        )
        if failed:
            # The Call wall keeps the last count a failed request reached.
            await self._progress.close(flush=True)
            await self.emit(console.ERROR, self.request_id, message=message)

    def _release_routes(self) -> None:
        """However the request ended, none of its streams is load on a route now
        (idempotent)."""
        for generation in self.generations:
            if generation.segments:
                route_session_close(decision=generation.segments[-1].decision)

    async def _generate(self, generation: Generation) -> AsyncGenerator[Piece, None]:
        """One choice's pieces, its end last, over as many routes as it takes."""
        wait = SlotWait(
            deadline=self.busy_deadline, clock=self.clock, sleep=self.sleep, rng=self.rng
        )
        while True:
            try:
                async for piece in self._segment(generation, wait):
                    yield piece
                break
            except RouteBusy:
                await wait.wait()
            except HopFailure as failure:
                generation.failovers += 1
                wait.over()
                await self._fail_over(
                    generation, failure, exhausted=generation.failovers > MAX_FAILOVERS
                )
        yield Piece(generation.choice, finish_reason=generation.finish_reason)

    async def _use(self, decision: RouteDecision, generations: Sequence[Generation]) -> None:
        """Serve ``generations`` on ``decision``'s route from now on."""
        for generation in generations:
            generation.segments.append(
                Segment(decision=decision, replayed=len(generation.token_ids), started=self.clock())
            )
        await database_call(recording.chat_request_route)(
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

    def _generate_request(self, generation: Generation) -> GenerateRequest:
        """What the head of ``generation``'s route is sent, signed afresh for every send:
        a retry or a failover opens new sessions."""
        plan = generation.route.plan
        prompt = generation.prompt
        return plan_sign(
            GenerateRequest(
                request_id=self.request_id,
                model=plan.model_key,
                hops=tuple(
                    PlanHop(hop.node_id, hop.endpoint, hop.start_layer, hop.end_layer)
                    for hop in plan.hops
                ),
                messages=[] if isinstance(prompt, str) else prompt,
                prompt=prompt if isinstance(prompt, str) else None,
                max_tokens=self.params.max_tokens,
                sampling=generation.sampling,
                stop=self.params.stop,
                resume_token_ids=list(generation.token_ids),
                logprobs=self.params.logprobs,
                top_logprobs=self.params.top_logprobs,
                echo=self._echo_asked(generation),
            )
        )

    def _echo_asked(self, generation: Generation) -> bool:
        """Whether this send of ``generation`` asks the head for the prompt's scores: until
        they were relayed (a route that fails before its first frame echoed nothing), and
        always when no token is asked (the head needs something to do)."""
        if not self.params.prompt_scored:
            return False
        return not generation.echoed or self.params.max_tokens == 0

    async def _segment(self, generation: Generation, wait: SlotWait) -> AsyncIterator[Piece]:
        """Stream the current route's pieces of one choice; raise HopFailure if one of
        its nodes fails."""
        segment = generation.segments[-1]
        plan = segment.decision.plan
        request = self._generate_request(generation)

        async def connected() -> None:
            # The route's clock starts. Waiting for a slot is over only at the first
            # token: a downstream hop may still answer busy (hop_busy) after the
            # head's 200 and its prefill, and the back-off must keep growing then.
            segment.started = self.clock()
            await self.emit(console.CONNECTED, self.request_id, endpoint=plan.head.endpoint)

        _in_flight[plan.head.endpoint][self.request_id] += 1
        # Counted as load on the route while it streams (again after a busy wait).
        route_session_open(decision=segment.decision, stream=generation)
        try:
            frames = head_stream(
                client=self.client,
                request=request,
                silence=silence_limit(
                    step_timeout=self.step_timeout,
                    hops=len(plan.hops),
                    positions=generation.prompt_count.tokens + len(generation.token_ids),
                    echo=request.echo,
                ),
                on_connected=connected,
                prompt_checked=generation.prompt_count.exact,
            )
            async with aclosing(frames):
                async for frame in frames:
                    if frame.token_ids:  # the whole route took the step: a slot at last
                        wait.over()
                        self._progress.changed()
                    if self.params.echo and not generation.echoed:
                        yield generation.echo(frame)
                    piece = generation.absorb(frame, request_id=self.request_id)
                    if frame.token_ids:  # the route's pace so far is load information
                        route_session_touch(
                            decision=segment.decision, stream=generation, tokens=segment.produced
                        )
                    if piece is not None:
                        if self._first_token_at is None:
                            self._first_token_at = self.clock()
                        yield piece
        finally:
            _stream_ended(plan.head.endpoint, self.request_id)
            # However the stream ended, it is no longer load on the route.
            route_session_close(decision=segment.decision, stream=generation)

    async def _report_progress(self) -> None:
        """Tell the console how far the request is (run by the throttle, off the relay)."""
        elapsed = self.clock() - self._started
        tokens = self.completion_tokens
        await self.emit(
            console.PROGRESS,
            self.request_id,
            tokens=tokens,
            tokens_per_second=round(tokens / elapsed, 2) if elapsed > 0 else None,
            queue=_queue_ahead(self.generations[0].route.plan.head.endpoint, self.request_id),
        )

    async def _fail_over(
        self, generation: Generation, failure: HopFailure, *, exhausted: bool
    ) -> None:
        banned_at = self._banned_at.get(failure.node_id)
        if banned_at is None or generation.segments[-1].started > banned_at:
            ban = node_ban(node_id=failure.node_id)
            self._banned_at[failure.node_id] = self.clock()
            logger.warning(
                "request %s choice %d: hop %s failed (%s); banned for %.0f s",
                self.request_id,
                generation.choice,
                failure.node_id,
                failure.message,
                ban,
            )
        else:  # a sibling choice's failure, already banned for: only re-route
            logger.info(
                "request %s choice %d: hop %s failed (%s), as it did for another choice",
                self.request_id,
                generation.choice,
                failure.node_id,
                failure.message,
            )
        if exhausted or self.params.route is not None:
            why = "pinned route" if self.params.route is not None else "too many failovers"
            raise UpstreamFailed(
                f"Node {failure.node_id} failed mid-generation ({failure.message}); "
                f"no failover ({why})"
            )
        decision = await database_call(route_choose)(model=self.model)
        await self._use(decision, [generation])

    @property
    def finish_reason(self) -> str:
        """The request's: ``length`` if any choice ran out of tokens, else ``stop``."""
        reasons = {g.finish_reason for g in self.generations}
        return "length" if "length" in reasons else min(reasons)

    async def _finish_completed(self) -> None:
        """Record the request completed and billed, learn its route's speed and tell the
        console, to the end even if the client leaves meanwhile (shielded: the whole
        answer was generated, so it is owed)."""
        self._completion = asyncio.ensure_future(self._complete_owed())
        await asyncio.shield(self._completion)

    async def _complete_owed(self) -> None:
        """``_complete``; if it fails after the client left, nobody awaits it: the
        request ends here as the consumer would have ended it."""
        try:
            await self._complete()
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

    async def _complete(self) -> None:
        # ``proxy complete`` below carries the final count: no progress after it.
        await self._progress.close()
        now = self.clock()
        completion = self.completion_tokens
        work = work_merged(unit for g in self.generations for unit in g.work())
        elapsed = now - self._started
        tps = completion / elapsed if elapsed > 0 else None
        ttft = (self._first_token_at - self._started) * 1000 if self._first_token_at else None
        complete = database_call(recording.chat_request_complete)
        # A database blip now would leave a generated answer unbilled; the write is
        # conditional (only a request still processing), so a retry never bills twice.
        await through_outage(
            lambda: complete(
                request_id=self.request_uuid,
                model=self.model,
                prompt_tokens=self.prompt_tokens,
                completion_tokens=completion,
                finish_reason=self.finish_reason,
                time_to_first_token_ms=ttft,
                tokens_per_second=tps,
                work=work,
                fee_share=self.fee_share,
                now=timezone.now(),
            ),
            sleep=self.sleep,
        )
        # One speed sample a request, as routing counts them: the first choice's last route.
        last = self.generations[0].segments[-1]
        route_sample_record(
            decision=last.decision, output_tokens=last.produced, elapsed_seconds=now - last.started
        )
        node_bans_clear(
            node_ids=sorted({n for g in self.generations for n in g.route.plan.node_ids})
        )
        await self.emit(
            console.COMPLETE,
            self.request_id,
            signature=last.decision.plan.signature,
            completion_tokens=completion,
            tokens_per_second=round(tps, 2) if tps else None,
            finish_reason=self.finish_reason,
        )
