"""The completion proxy: run one client request along learned routes, stage by stage.

:class:`CompletionProxy` serves every completion endpoint and only
orchestrates: it admits the request (:mod:`~tracker_app.completions.admission`:
the prompts counted, the key's share taken, the route chosen, the record
opened), runs each of its choices (``n`` for each prompt,
:class:`~tracker_app.completions.generation.Generation`) at once, streams
the head nodes' frames (:mod:`~tracker_app.completions.head_stream`), hands
what they produce to the endpoint's answer
(:mod:`~tracker_app.completions.answers`) as tokens arrive, fails a choice
over when a hop dies (:mod:`~tracker_app.completions.failover`), and ends
the request once, whichever way it ended
(:mod:`~tracker_app.completions.finishing`: recorded, billed, its routes and
its key's share let go). Along the way it emits the console events of the
Call wall (:mod:`~tracker_app.completions.console`). ``run()`` ends in a
:class:`CompletionResult`, which the consumer renders.

Per token (the hot path) it only counts the token ids, writes the client's
event from a per-request template (:class:`~tracker_app.completions.answers.TextEvents`)
and marks progress changed: no database, no channel layer. Progress reaches
the dashboards through :class:`~tracker_app.completions.progress.ProgressThrottle`, at
most once per
:data:`~tracker_app.completions.proxy_terms.PROGRESS_INTERVAL_SECONDS`, the
final count with ``proxy complete``.

Limits (ADR-0004): a request takes a lease on its API key's share of
requests and KV tokens in flight before it is routed
(:mod:`~tracker_app.api_keys.in_flight`), released however it ends. A
choice waits for a busy route's slot at most ``MESHNET_BUSY_DEADLINE``
seconds in all, retrying with capped, jittered exponential back-off
(:mod:`~tracker_app.completions.slots`), then the request ends in a 503
``route_busy`` with ``Retry-After``; a node whose busy answers the tracker
cannot explain is banned instead (:mod:`~tracker_app.completions.busy_claims`).
A head silent past :func:`~tracker_app.completions.head_stream.silence_limit`
(from ``MESHNET_HOP_STEP_TIMEOUT``) has failed, like a hop the head reports
hung; and no request runs past ``MESHNET_REQUEST_DEADLINE`` in all
(:mod:`~tracker_app.completions.deadline`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, cast

import httpx

from meshnet_site.errors import DomainError
from routing_app.policies.choice import RouteDecision
from routing_app.services import route_session_close, route_session_open, route_session_touch
from tracker_app.api_keys.in_flight import KeyShare
from tracker_app.completions import console
from tracker_app.completions.admission import admit, admitted_generations
from tracker_app.completions.busy_claims import BUSY_CLAIMS, busy_claim_judged
from tracker_app.completions.deadline import RequestDeadline
from tracker_app.completions.failover import Failover, replay_request
from tracker_app.completions.finishing import RequestFinish
from tracker_app.completions.generation import Generation, Piece, Segment
from tracker_app.completions.head_queue import HEAD_QUEUES
from tracker_app.completions.head_stream import (
    GrammarNotFollowed,
    HopFailure,
    RouteBusy,
    head_batches,
    head_request,
    silence_limit,
)
from tracker_app.completions.interleaving import interleaved
from tracker_app.completions.prefix_scope import prefix_scope
from tracker_app.completions.progress import ProgressThrottle
from tracker_app.completions.prompt_tokens import model_text
from tracker_app.completions.proxy_terms import (
    CompletionRequest,
    CompletionResult,
    ProxySettings,
    Send,
)
from tracker_app.completions.recording import RequestRecord
from tracker_app.completions.shapes import MeshnetRoute, MeshnetSpeculation, usage_of
from tracker_app.completions.slots import SlotWait


class CompletionProxy:
    """One client request of any completion endpoint, its ``n`` choices (each prompt's)
    generated at once: :meth:`start`, then :meth:`run`; :meth:`fail` on any exit."""

    def __init__(
        self,
        request: CompletionRequest,
        *,
        client: httpx.AsyncClient,
        settings: ProxySettings | None = None,
        emit: Callable[..., Awaitable[Any]] = console.console_emit,
    ) -> None:
        """``client``: the pool to the heads; ``settings``: the deployment's by default;
        ``emit``: where console events go."""
        self.params, self.model = request.params, request.model
        self.client = client
        self.settings = settings or ProxySettings.from_settings()
        self.emit = emit
        self.record = RequestRecord(
            api_key=request.api_key,
            model=request.model,
            fee_share=self.settings.fee_share,
            sleep=self.settings.sleep,
            api=request.answer.api,
        )
        self.request_id = str(self.record.request_id)
        self.answer = request.answer(
            completion_id=f"{request.answer.id_prefix}{self.record.request_id.hex}",
            created=int(time.time()),
            params=request.params,
        )
        self.failover = Failover(
            request_id=self.request_id,
            model=request.model,
            pinned=request.params.route is not None,
            clock=self.settings.clock,
        )
        self.generations: list[Generation] = []
        # Whose cached prefixes its nodes may reuse: the key's own, or the model's shared.
        self.prefix_scope = prefix_scope(
            api_key_id=request.api_key.pk,
            model_key=request.model.key,
            shared=request.model.prefix_cache_shared,
        )
        # The request's lease on its key's share of requests and KV tokens in flight.
        self.share = KeyShare(
            api_key=request.api_key,
            request_id=self.record.request_id,
            seconds=self.settings.key_lease_seconds,
        )
        self._progress = ProgressThrottle(
            interval=self.settings.progress_interval, report=self._report_progress
        )
        # How the request ends, once; its clock starts here (again once admitted).
        self.finish = RequestFinish(
            record=self.record,
            share=self.share,
            progress=self._progress,
            emit=emit,
            clock=self.settings.clock,
            n=request.params.n,
        )
        self.deadline = RequestDeadline(
            seconds=self.settings.request_deadline,
            started=self.finish.started,
            clock=self.settings.clock,
        )
        # Choice → the head streaming it now (the ones a passed deadline blames).
        self._streaming: dict[int, str] = {}

    def _meshnet(self, *, final: bool = False) -> MeshnetRoute:
        """The ``meshnet`` extension field: the route serving the (first) choice now;
        ``final`` (a whole reply, a stream's last event) adds every choice's drafts sent
        and accepted."""
        first = self.generations[0] if self.generations else None
        route = first.route.to_dict() if first is not None and first.segments else {}
        meshnet = cast(MeshnetRoute, route)  # RouteDecision.to_dict gives this shape
        if final:
            drafted = sum(generation.speculation[0] for generation in self.generations)
            accepted = sum(generation.speculation[1] for generation in self.generations)
            meshnet["speculation"] = MeshnetSpeculation(drafted=drafted, accepted=accepted)
        return meshnet

    async def start(self) -> None:
        """Admit the request (:func:`~tracker_app.completions.admission.admit`): count the
        prompts, take the key's share, choose the route of every choice and open the
        request's record (with that route).

        Raises a ``DomainError`` (a prompt the model refuses, the key's share used
        up, no route, bad pinned route) before anything is streamed, so the client
        gets a plain error response. A request torn down meanwhile (its client
        left) lets the admission end first, so that :meth:`fail` finds, and gives
        back, what it took.
        """
        admitted = await admit(
            params=self.params,
            model=self.model,
            share=self.share,
            record=self.record,
            prefix_scope=self.prefix_scope,
            abandoned=self.finish.route_abandoned,
        )
        self.finish.started = self.settings.clock()
        self.generations = admitted_generations(
            self.params, admitted, clock=self.settings.clock, prefix_scope=self.prefix_scope
        )
        await self._use(admitted.decision, self.generations, recorded=True)

    async def run(self, send: Send) -> CompletionResult:
        """Send the client's server-sent events (``data: …``, ``[DONE]`` not included) in
        the answer's shape: its opening, text as it comes, each choice's end, usage last.

        A failure with no route left ends the events with an ``{"error": …}``
        one and the result with the error; the request is then recorded failed
        and not charged.
        """
        first = self.generations[0].prompt_count
        # Billed as counted when the count is exact (one prompt: the new APIs' case).
        known = first.tokens if first.exact and len(self.params.prompts) == 1 else None
        for event in self.answer.opening(self._meshnet(), known):
            await send(event)
        unfinished, last = len(self.generations), None
        generated = False  # every choice to its end: the key's share goes with the record
        try:
            # Nothing a head streams extends the deadline (``: step`` comments included).
            async with (
                self.deadline.enforced(self._streaming, request_id=self.request_id),
                aclosing(interleaved([self._generate(g) for g in self.generations])) as batches,
            ):
                async for pieces in batches:
                    # The events of one batch (one read of a head) go in one write.
                    events: list[bytes] = []
                    sent: list[Generation] = []
                    for piece in pieces:
                        if piece.finish_reason is None:
                            event = self.answer.piece(piece)
                            if event:  # nothing while a tool call is held back
                                events.append(event)
                                sent.append(self.generations[piece.choice])
                            continue
                        unfinished -= 1
                        stop = self._stop_of(self.generations[piece.choice])
                        if unfinished:
                            events.append(
                                self.answer.finish(piece.choice, piece.finish_reason, None, stop)
                            )
                            sent.append(self.generations[piece.choice])
                        else:
                            last = piece  # ends the answer with usage, once it is billed
                    if events:
                        await send(events[0] if len(events) == 1 else b"".join(events))
                        for generation in sent:
                            self._sent(generation)
            generated = True
        except DomainError as error:
            await self.finish.network_failed(error.message, self.generations)
            await send(self.answer.failed(error))
            return CompletionResult(error=error)
        finally:
            # Torn down by its client (cancelled): no progress outlives the request.
            self._progress.cancel()
            self.finish.release_routes(self.generations)
            if not generated:
                await asyncio.shield(self.share.release())
        completion = await self.finish.completed(self.generations)
        usage = usage_of(
            completion.prompt_tokens, completion.completion_tokens, completion.cached_tokens
        )
        assert last is not None and last.finish_reason is not None
        stop = self.generations[last.choice].stop_sequence
        meshnet = self._meshnet(final=True)
        await send(self.answer.finish(last.choice, last.finish_reason, usage, stop, meshnet))
        if self.params.stream:
            return CompletionResult()
        return CompletionResult(reply=self.answer.reply(self.generations, usage, meshnet))

    def _stop_of(self, generation: Generation) -> str | None:
        """The client's stop sequence that ended ``generation``, kept on it; None when
        none did or the request has none (the tokenizer is loaded once it has)."""
        if self.params.stop:
            text = model_text(self.model.weight_source)
            tokenizer = text.tokenizer if text is not None else None
            generation.stop_sequence = generation.stopped_by(self.params.stop, tokenizer)
        return generation.stop_sequence

    def _sent(self, generation: Generation) -> None:
        """The client now holds all ``generation`` produced (a stream's client; a whole
        answer is sent at its end)."""
        if self.params.stream:
            generation.mark_delivered()

    async def fail(self, message: str, *, cancelled: bool = False) -> None:
        """Record the request failed, never charged, or cancelled by its client
        (``cancelled``), on any exit path, as often as it is called
        (:meth:`~tracker_app.completions.finishing.RequestFinish.fail`)."""
        await self.finish.fail(message, self.generations, cancelled=cancelled)

    async def _generate(self, generation: Generation) -> AsyncGenerator[list[Piece], None]:
        """One choice's pieces, its end last, over as many routes as it takes; in batches,
        each the pieces of one read of a head."""
        wait = SlotWait(
            deadline=self.settings.busy_deadline,
            clock=self.settings.clock,
            sleep=self.settings.sleep,
            rng=self.settings.rng,
        )
        while True:
            try:
                async for pieces in self._segment(generation, wait):
                    yield pieces
                break
            except RouteBusy as busy:
                failure = await busy_claim_judged(
                    busy, now=self.settings.clock(), grace=self.settings.busy_claim_grace
                )
                if failure is None:
                    await wait.wait()
                    continue
                wait.over()
                await self._use(await self.failover.reroute(generation, failure), [generation])
            except HopFailure as failure:
                if failure.grammar_unfollowed:
                    raise GrammarNotFollowed(
                        f"Node {failure.node_id} could not follow the request's grammar "
                        "(bad_grammar); nobody was blamed"
                    ) from None
                wait.over()
                await self._use(await self.failover.reroute(generation, failure), [generation])
        yield [Piece(generation.choice, finish_reason=generation.finish_reason)]

    async def _use(
        self, decision: RouteDecision, generations: Sequence[Generation], *, recorded: bool = False
    ) -> None:
        """Serve ``generations`` on ``decision``'s route from now on (``recorded``: they
        already are, and the request's record names it: the first route)."""
        if not recorded:
            for generation in generations:
                generation.segments.append(
                    Segment(
                        decision=decision,
                        replayed=len(generation.token_ids),
                        started=self.settings.clock(),
                    )
                )
            await self.record.route(decision)
        await self.emit(
            console.ROUTE_SELECTED,
            self.request_id,
            model=self.model.key,
            api=self.record.api,
            mode=str(decision.mode),
            signature=decision.plan.signature,
            hops=decision.plan.to_dict(),
        )

    async def _segment(self, generation: Generation, wait: SlotWait) -> AsyncIterator[list[Piece]]:
        """Stream the current route's pieces of one choice, a batch per read of the head;
        raise HopFailure if one of its nodes fails."""
        segment = generation.segments[-1]
        plan = segment.decision.plan
        if generation.token_ids or generation.echoed:  # streamed before: resume it
            request = replay_request(
                generation,
                params=self.params,
                request_id=self.request_id,
                lasts=self.deadline.left(),
            )
        else:
            request = head_request(
                generation,
                params=self.params,
                request_id=self.request_id,
                lasts=self.deadline.left(),
            )

        async def connected() -> None:
            # The route's clock starts. Waiting for a slot is over only at the first
            # token: a downstream hop may still answer busy (hop_busy) after the
            # head's 200 and its prefill, and the back-off must keep growing then.
            segment.started = self.settings.clock()
            # The head answered 200: it holds a session for this stream now.
            HEAD_QUEUES.sessions_opened([plan.head.node_id])
            holding.append(plan.head.node_id)
            await self.emit(console.CONNECTED, self.request_id, endpoint=plan.head.endpoint)

        nodes = plan.node_ids
        holding: list[str] = []  # the nodes this stream holds a session on
        HEAD_QUEUES.joined(plan.head.endpoint, self.request_id)
        self._streaming[generation.choice] = plan.head.node_id
        served = False
        # Counted as load on the route while it streams (again after a busy wait).
        route_session_open(
            decision=segment.decision,
            stream=generation,
            planned=self.params.max_tokens - len(generation.token_ids),
        )
        try:
            batches = head_batches(
                client=self.client,
                request=request,
                silence=silence_limit(
                    step_timeout=self.settings.step_timeout,
                    hops=len(plan.hops),
                    positions=generation.prompt_count.tokens + len(generation.token_ids),
                    echo=request.echo,
                ),
                on_connected=connected,
                prompt_checked=generation.prompt_count.exact,
            )
            async with aclosing(batches):
                async for frames in batches:
                    pieces: list[Piece] = []
                    stepped = False  # some frame of the batch carried tokens
                    for frame in frames:
                        if frame.token_ids:  # the whole route took the step: a slot at last
                            stepped = True
                            wait.over()
                            self._progress.changed()
                            if not served:  # whatever busy its nodes answered is behind them
                                served = True
                                BUSY_CLAIMS.served(nodes)
                                downstream = [n for n in nodes if n not in holding]
                                HEAD_QUEUES.sessions_opened(downstream)
                                holding.extend(downstream)
                        if self.params.echo and not generation.echoed:
                            pieces.append(generation.echo(frame))
                        piece = generation.absorb(frame, request_id=self.request_id)
                        if piece is not None:
                            pieces.append(piece)
                            if self.finish.first_token_at is None:
                                self.finish.first_token_at = self.settings.clock()
                        if generation.overrun is not None:
                            break  # the head ran past the client's limits: read no more
                    if stepped:  # the route's pace so far is load information
                        route_session_touch(
                            decision=segment.decision, stream=generation, tokens=segment.produced
                        )
                    if pieces:
                        yield pieces
                    if generation.overrun is not None:
                        break
        finally:
            HEAD_QUEUES.left(plan.head.endpoint, self.request_id)
            HEAD_QUEUES.sessions_closed(holding)
            if self.deadline.left() > 0:  # past it, the deadline's blame still needs it
                self._streaming.pop(generation.choice, None)
            # However the stream ended, it is no longer load on the route.
            route_session_close(decision=segment.decision, stream=generation)

    async def _report_progress(self) -> None:
        """Tell the console how far the request is (run by the throttle, off the relay)."""
        elapsed = self.settings.clock() - self.finish.started
        tokens = sum(len(g.token_ids) for g in self.generations)
        await self.emit(
            console.PROGRESS,
            self.request_id,
            tokens=tokens,
            tokens_per_second=round(tokens / elapsed, 2) if elapsed > 0 else None,
            queue=HEAD_QUEUES.ahead(self.generations[0].route.plan.head.endpoint, self.request_id),
        )
