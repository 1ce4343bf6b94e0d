"""The route driver: the head drives a generation along its route, step by step.

Each step runs the head's own layers, then sends the hidden states to every
downstream hop in order, each over the head's persistent link to that hop
(``hop_links``; binary frames, see ``wire.frames``): the hop that ends at the last layer
samples and answers with the token. Steps of different generations that are
ready together share a frame on each link, but every generation keeps its own
loop, sessions, cancel and failover. The
first step is the prefill (the templated prompt plus any resumed tokens); each
later step sends one position, or a draft round: the last token and the drafts
``head.drafts`` proposes (by prompt lookup, or by the head's draft model where
it has one, whichever promises more), as many as ``head.speculation`` says
pay, verified by the last hop, every session cut back past the rejected ones
(ADR-0028). Every
hop keeps its own KV cache for the session, freed at the end, on cancel, on
failure, and by the idle reaper.

Each hop session gets a capability of its own, chosen here; the step that
opens it carries the tracker's signed plan as well (see ``engine.trust``). A hop's
error is reported by its node id, status and error code only: its message
is the hop's to write, goes to this node's log, and never reaches the
tracker or a client. What the choices become on the wire (text, stops,
logprobs, frames) is the output processor's (:mod:`nodes_app.runtime.head.output`);
what a hop's answer must hold is :mod:`nodes_app.runtime.head.hop_answers`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence

from nodes_app.protocol.decoding import is_count
from nodes_app.protocol.errors import (
    BAD_GRAMMAR,
    HOP_BUSY,
    HOP_FAILED,
    HOP_TIMED_OUT,
    relayable_code,
)
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.limits import (
    ECHO_MAX_SCORES,
    PREFIX_MAX_BLOCKS,
    echo_scores,
    step_time_limit,
)
from nodes_app.protocol.signed_plan import PlanHop
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.prefix_cache import Hit, agreed
from nodes_app.runtime.engine.sampler import TailRequest
from nodes_app.runtime.engine.trust import capability_hash, new_capability
from nodes_app.runtime.faults import NonFiniteOutput, RuntimeRequestError
from nodes_app.runtime.head.drafts import DraftModel, GrammarForced, PromptLookup
from nodes_app.runtime.head.hop_answers import BadAnswer, choice_of, hidden_of
from nodes_app.runtime.head.hop_links import HopLinks, LinkDropped, LinkError, LinkTimeout
from nodes_app.runtime.head.output import OutputProcessor
from nodes_app.runtime.head.speculation import DRAFT_MODEL, DraftPolicy, TimingBook
from nodes_app.runtime.wire.entries import Choice, ForwardStep, StepAnswer, TokenScore
from nodes_app.shared.grammar import grammar_matcher, grammar_problem
from nodes_app.shared.prefix_chain import block_hashes, chain_seed
from nodes_app.shared.prompting import TemplateRefused, prompt_token_ids, text_token_ids

logger = logging.getLogger("meshnet.node")

# How long the head waits for a hop to answer the cancel of a session.
CANCEL_SECONDS = 5.0


class RoundRefused(Exception):
    """A hop refused a draft round's fields (``bad_field``): it does not take rounds."""

    def __init__(self, hop: PlanHop) -> None:
        super().__init__(hop.node_id)
        self.hop = hop


class HopFailed(Exception):
    """A downstream hop did not answer a step; ``code`` says how (the error frame's code).

    ``code`` is ``hop_busy`` when the hop was at its session cap, ``hop_timeout``
    when it did not answer within the step's deadline, else ``hop_failed``.
    ``message`` names what went wrong in the head's own words (a status, an
    error code, an exception's type), never the hop's response text.
    """

    def __init__(
        self, hop: PlanHop, message: str, *, busy: bool = False, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.hop = hop
        self.message = message
        self.busy = busy
        self.code = code or (HOP_BUSY if busy else HOP_FAILED)


async def prompt_for(service: NodeService, request: GenerateRequest) -> list[int]:
    """The request's prompt token ids, checked to fit the model's context with its budget.

    Chat messages go through the model's chat template, a raw ``prompt``
    through the tokenizer alone. Tokenised on the torch worker (never on the
    event loop) and before any byte is streamed, so a template that refuses
    the messages, an empty prompt, a token id past the model's vocabulary (a
    tokenizer's added token), an echo too large to report or a grammar the
    tokenizer cannot follow is a 400.
    """
    tokenizer = service.shard.tokenizer
    text = request.prompt
    try:
        if text is not None:
            prompt = await service.compute(lambda: text_token_ids(tokenizer, text))
        else:
            prompt = await service.compute(
                lambda: prompt_token_ids(tokenizer, request.messages, request.tools)
            )
    except TemplateRefused as error:  # the chat template's own complaint, e.g. role order
        raise RuntimeRequestError(error.message, code="invalid_request") from error
    if not prompt:
        raise RuntimeRequestError("the prompt has no tokens", code="invalid_request")
    # A tokenizer may add tokens the model has no row for: run, such an id would
    # crash this head's embedding, or make it blame the honest tail that refused it.
    vocab = service.admission.vocab_size
    if max(prompt) >= vocab:
        raise RuntimeRequestError(
            f"the prompt tokenises to ids past the model's vocabulary (0..{vocab - 1})",
            code="invalid_request",
        )
    scores = echo_scores(len(prompt), request.top_logprobs)
    if request.echo and scores > ECHO_MAX_SCORES:
        raise RuntimeRequestError(
            f"an echo of {len(prompt)} prompt tokens with {request.top_logprobs} alternatives "
            f"each is more than the {ECHO_MAX_SCORES} logprobs this node reports",
            code="prompt_too_long",
        )
    needed = len(prompt) + request.max_tokens
    if needed > service.admission.context_length:
        raise RuntimeRequestError(
            f"the prompt ({len(prompt)} tokens) plus max_tokens ({request.max_tokens}) exceeds "
            f"the model's context of {service.admission.context_length} tokens",
            code="context_length_exceeded",
        )
    grammar = request.sampling.grammar
    if grammar is not None:
        # Compiled here before any hop sees it: a grammar this model's tokenizer cannot
        # follow is the requester's 400, never a failure blamed on the last hop.
        problem = await service.compute(lambda: grammar_problem(grammar, service.grammar_words))
        if problem:
            raise RuntimeRequestError(
                f"the grammar cannot be followed: {problem}", code="bad_grammar"
            )
    return prompt


class RouteDriver:
    """One ``/v1/generate`` call on the head; iterate :meth:`stream` for SSE frames."""

    def __init__(
        self,
        service: NodeService,
        links: HopLinks,
        request: GenerateRequest,
        prompt: list[int],
        *,
        timings: TimingBook | None = None,
    ):
        self.service = service
        self.links = links
        self.request = request
        self.prompt = prompt
        self.session_id = f"{request.request_id}.{uuid.uuid4().hex[:12]}"
        self.output = OutputProcessor(service, request, prompt)
        head = request.hops[0]
        # Positions the generation may reach: what each node reserves of its KV budget.
        self.reserve = len(prompt) + request.max_tokens
        # Whose prefix cache the generation may use (ADR-0027): none without a scope,
        # nor for an echo, which scores every prompt position.
        self.scope = "" if request.echo else request.prefix_scope
        # Opened now, so a full node answers 503 before the stream starts. Its
        # capability is known to nobody: only this generation frees it.
        self.session = service.admission.open_session(
            self.session_id,
            0,
            head.end_layer,
            capability=capability_hash(new_capability()),
            reserve=self.reserve,
            prefix=bool(self.scope),
        )
        # Where the route's first step starts (past what every node's prefix cache
        # held), every token run so far, and whether the generation ended cleanly
        # (only then is its state kept for the next prompt).
        self.first_position = 0
        self.ran: list[int] = []
        self.clean = False
        # Indexes (into hops[1:]) of the hops that may hold a session of this generation.
        self.contacted: list[int] = []
        # One capability per hop session; the signed plan opens each of them.
        self.capabilities = [new_capability() for _ in request.hops[1:]]
        self.plan_header = request.plan.to_header() if request.signature else None
        # Speculative decoding (ADR-0028), unless the request turns it off: drafts by
        # prompt lookup and, on a head with one, by the draft model, each with its
        # policy over its own timing of the route.
        self.speculating = request.speculation
        route = tuple((hop.endpoint, hop.start_layer, hop.end_layer) for hop in request.hops)
        book = timings or TimingBook()
        text = [*prompt, *request.resume_token_ids]
        self.lookup = PromptLookup(text, stop_ids=self.output.stop_ids)
        self.policy = DraftPolicy(book.of(route))
        self.proposers: list[tuple[PromptLookup | DraftModel, DraftPolicy]] = [
            (self.lookup, self.policy)
        ]
        self.draft: DraftModel | None = None
        self.primed = False
        if service.draft is not None and self.speculating:
            self.draft = DraftModel(
                service.draft,
                text,
                vocab=service.admission.vocab_size,
                stop_ids=self.output.stop_ids,
                limit=self.reserve,
            )
            self.proposers.append((self.draft, DraftPolicy(book.of(route, DRAFT_MODEL))))
        # Under a grammar, what it forces drafts first (built as the stream starts).
        self.forced: GrammarForced | None = None

    async def stream(self) -> AsyncIterator[bytes]:
        self.service.streams += 1
        try:
            async for frame in self._frames():
                yield frame
        finally:
            self.service.streams -= 1
            self._release()

    async def _frames(self) -> AsyncIterator[bytes]:
        request, output = self.request, self.output
        opening = output.opening()
        if opening is not None:
            yield opening
        step_ids = self.prompt + request.resume_token_ids
        self.ran = list(step_ids)
        try:
            start = await self._claim(step_ids)
        except HopFailed as failure:
            for event in output.failed(failure.hop.node_id, failure.message, failure.code):
                yield event
            return
        output.cached_tokens = start
        step_ids = step_ids[start:]
        if self.speculating and request.sampling.grammar is not None:
            self.forced = await self._grammar_forced(request.sampling.grammar)
        while output.finish is None:
            prefill = output.produced == 0
            drafts, policy, drafting = ([], None, 0.0) if prefill else await self._drafts()
            began = time.perf_counter()
            try:
                choice = await self._step(step_ids + drafts, self._tail(prefill, drafts))
            except HopFailed as failure:
                for event in output.failed(failure.hop.node_id, failure.message, failure.code):
                    yield event
                return
            if not self.speculating:
                drafts = []  # a hop refused the round: the step ran plainly
            seconds = time.perf_counter() - began
            self._measured(len(step_ids), drafts, policy, choice, seconds, drafting)
            if prefill and request.echo:
                # Up to ECHO_MAX_SCORES values to write: built off the event loop.
                yield await asyncio.to_thread(output.echo, choice)
                if output.budget <= 0:
                    output.finish = "length"
                    break
            step_ids = [choice.token_id]
            # The accepted drafts, then the chosen token: delivered one by one, so a
            # stop sequence or an end-of-text token ends the answer where it would.
            for token in _delivered(drafts, choice):
                self.ran.append(token.token_id)
                if self.speculating:
                    self.lookup.extend([token.token_id])
                    if self.forced is not None:
                        self.forced.extend([token.token_id])
                    if self.draft is not None:
                        self.draft.extend([token.token_id])
                frame = output.token(token)
                if frame is not None:
                    yield frame
                if output.finish is not None:
                    break
            # A route of this node alone may step inline on the event loop, and an
            # answer already computed does not suspend: one turn of the loop per
            # token, or it reads no socket until the answer ends (not its client
            # leaving, not a health check, not a link being opened to this node).
            await asyncio.sleep(0)
        self.clean = True
        for event in output.closing():
            yield event

    def _tail(self, opening: bool, drafts: list[int]) -> TailRequest:
        """What the last hop does with this generation's step (the prefill when ``opening``;
        a draft round of ``drafts`` when any)."""
        request = self.request
        return TailRequest(
            request.sampling,
            logprobs=request.top_logprobs if request.logprobs else None,
            prompt_ids=tuple(self.prompt) if opening and request.echo else (),
            generated_ids=(
                tuple(request.resume_token_ids)
                if opening and request.sampling.history_dependent
                else ()
            ),
            drafts=tuple(drafts),
        )

    async def _drafts(self) -> tuple[list[int], DraftPolicy | None, float]:
        """The drafts of the next step, the policy of the proposer that drafted them and
        the seconds drafting took.

        As many as the route's timing and the answer's acceptance say pay, within
        the budget (the chosen token must still fit): what the grammar forces where
        it forces anything (counted as prompt lookup's: both are free), else from
        the proposer whose plan promises more tokens a second — a probe first, prompt
        lookup on a tie — and from the other when that one finds nothing.
        """
        if not self.speculating:
            return [], None, 0.0
        room = self.output.budget - self.output.produced - 1
        if self.forced is not None:
            forced = self.forced.propose(min(self.policy.drafts(), room))
            if forced:
                return forced, self.policy, 0.0
        plans = [(policy.plan(), proposer, policy) for proposer, policy in self.proposers]
        plans.sort(key=lambda plan: plan[0][1], reverse=True)
        for (drafts, _), proposer, policy in plans:
            limit = min(drafts, room)
            if limit <= 0:
                continue
            if isinstance(proposer, DraftModel):
                if not self.primed:
                    # The prompt, run once per generation as the route's prefill is:
                    # not a cost of any one round.
                    await self.service.compute(proposer.prime)
                    self.primed = True
                began = time.perf_counter()
                proposal = await self.service.compute(functools.partial(proposer.propose, limit))
                drafting = time.perf_counter() - began
            else:
                proposal, drafting = proposer.propose(limit), 0.0
            if proposal:
                return proposal, policy, drafting
        return [], None, 0.0

    async def _grammar_forced(self, grammar: str) -> GrammarForced:
        """The grammar's forced tokens as drafts: its matcher, compiled on the torch thread
        (a large schema takes a while) and advanced through any resumed tokens."""
        service, resumed = self.service, list(self.request.resume_token_ids)

        def build() -> GrammarForced:
            matcher = grammar_matcher(service.grammar_words, grammar)
            if resumed:
                matcher.consume_tokens(resumed)
            return GrammarForced(matcher, stop_ids=self.output.stop_ids)

        return await service.compute(build)

    def _measured(
        self,
        positions: int,
        drafts: list[int],
        policy: DraftPolicy | None,
        choice: Choice,
        seconds: float,
        drafting: float,
    ) -> None:
        """Learn from a decode step: a plain one's time (every proposer's timing), or a
        round's time, its drafting included, and acceptance (its proposer's)."""
        if drafts and policy is not None:
            policy.record_round(len(drafts), choice.accepted, seconds + drafting)
            self.output.drafted += len(drafts)
            self.output.accepted += choice.accepted
        elif positions == 1:
            for _, each in self.proposers:
                each.record_plain(seconds)

    async def _step(self, token_ids: list[int], tail: TailRequest) -> Choice:
        """:meth:`_through_route`, then a draft round's rejected positions cut off this
        head's session (every hop's is cut by the next step's position)."""
        session = self.session
        position = session.position
        try:
            choice = await self._through_route(token_ids, tail)
        except RoundRefused as refused:
            # A hop that does not take draft rounds (a node older than them): this
            # generation decodes plainly from here, every session cut back to the round's
            # start (those that ran it, by the plain step's position).
            logger.info("hop %s refused a draft round: speculation off", refused.hop.node_id)
            self.speculating = False
            await self._rewind(position)
            plain = dataclasses.replace(tail, drafts=())
            return await self._through_route(token_ids[: len(token_ids) - len(tail.drafts)], plain)
        if tail.drafts:
            await self._rewind(position + 1 + choice.accepted)
        return choice

    async def _rewind(self, position: int) -> None:
        """Cut this head's session back to ``position`` after a draft round."""
        session = self.session
        async with session.lock:
            try:
                await self.service.rewind(session, position)
            except Exception as error:
                logger.exception("the head's own rollback failed")
                raise HopFailed(self.request.hops[0], "the head's own step failed") from error

    async def _through_route(self, token_ids: list[int], tail: TailRequest) -> Choice:
        """One position (or the prefill, or a draft round) through every hop; the last
        hop's choice.

        Raises :class:`HopFailed` naming the node at fault: a hop that does not
        answer (within the step's deadline: ``hop_timeout``), answers an error,
        or answers a malformed, non-finite or out-of-vocabulary result (or other
        scores than ``tail`` asks for); the producer of hidden states a hop
        refused as non-finite; this head when its own layers compute them.
        """
        service, session = self.service, self.session
        hops = self.request.hops
        async with session.lock:
            position = session.position
            opening = position == self.first_position
            try:
                result = await service.head_forward(session, token_ids, tail)
            except NonFiniteOutput as error:
                raise HopFailed(hops[0], str(error)) from error
            except Exception as error:  # the batch this step ran in failed: this head's fault
                logger.exception("the head's own step failed")
                raise HopFailed(hops[0], "the head's own step failed") from error
            session.position += len(token_ids)
            session.touch()
        if isinstance(result, Choice):
            return result
        payload: bytes = result
        shape: tuple[int, int, int] = (1, len(token_ids), service.shard.hidden_size)
        dtype = service.dtype_name
        for index, hop in enumerate(hops[1:], start=1):
            last = index == len(hops) - 1
            # The last hop of an echo's prefill also scores every prompt position.
            limit = step_time_limit(
                service.step_timeout, len(token_ids), echo=last and bool(tail.prompt_ids)
            )
            # self.contacted and self.capabilities index hops[1:].
            if index - 1 not in self.contacted:
                self.contacted.append(index - 1)
            step = ForwardStep(
                session_id=self.session_id,
                start=hop.start_layer,
                end=hop.end_layer,
                position=position,
                dtype=dtype,
                shape=shape,
                # The tail's session keeps the sampling it opened with.
                sampling=tail.sampling if last and opening else None,
                sender=hops[index - 1].node_id,
                reserve=self.reserve if opening else None,
                logprobs=tail.logprobs if last else None,
                prompt_ids=tail.prompt_ids if last and tail.prompt_ids else None,
                generated_ids=tail.generated_ids if last and tail.generated_ids else None,
                token_ids=tuple(token_ids) if service.shard.family.per_layer_inputs else None,
                drafts=tail.drafts or None,
            )
            try:
                answer = await self.links.to(hop.endpoint).step(
                    step,
                    payload,
                    capability=self.capabilities[index - 1],
                    plan=self.plan_header if opening else None,
                    timeout=limit,
                )
            except LinkTimeout as error:
                logger.warning("hop %s: no answer to the step within %g s", hop.node_id, limit)
                raise HopFailed(
                    hop, f"did not answer the step within {limit:g} s", code=HOP_TIMED_OUT
                ) from error
            except LinkDropped as error:
                logger.warning("hop %s: %s", hop.node_id, error)
                # The head's own words (a status, a close code), never the hop's text.
                raise HopFailed(hop, str(error)) from error
            if answer.status == 400 and tail.drafts and answer.code == "bad_field":
                _status_of(hop, answer, answer.code)
                raise RoundRefused(hop)
            if answer.status != 200:
                code = relayable_code(answer.code)
                # A hop refusing non-finite input blames whoever computed it.
                blamed = hops[index - 1] if code == "non_finite_input" else hop
                raise HopFailed(
                    blamed,
                    f"{_status_of(hop, answer, code)} from {hop.node_id}",
                    busy=answer.status == 503,
                    code=BAD_GRAMMAR if code == BAD_GRAMMAR else None,
                )
            if last:
                if tail.prompt_ids:  # an echo's answer: up to ECHO_MAX_SCORES values to check
                    return await asyncio.to_thread(self._choice_of, hop, answer, tail)
                return self._choice_of(hop, answer, tail)
            payload, dtype = _hidden_of(hop, answer, shape)
        raise AssertionError("the plan's last hop ends at the last layer")

    def _choice_of(self, hop: PlanHop, answer: StepAnswer, tail: TailRequest) -> Choice:
        """The last hop's choice, holding what ``tail`` asked for, or that hop is at fault."""
        try:
            return choice_of(
                answer,
                vocab=self.service.admission.vocab_size,
                logprobs=tail.logprobs,
                prompt_scores=max(0, len(tail.prompt_ids) - 1),
                drafts=len(tail.drafts),
            )
        except BadAnswer as error:
            raise HopFailed(hop, str(error)) from error

    async def _claim(self, token_ids: list[int]) -> int:
        """Where the prefill starts: past the leading blocks every node holds (ADR-0027).

        The head looks its own cache up and claims from every hop at once (each
        claim opens that hop's session: one round trip, in parallel, before the
        prefill); a hop that refuses a claim but for being busy computes the
        prompt from the start, as before claims. The last position is always
        computed: the last hop samples from it.
        """
        if not self.scope:
            return 0
        service = self.service
        block = service.store.prefix.block
        usable = min((len(token_ids) - 1) // block, PREFIX_MAX_BLOCKS)
        seed = chain_seed(self.request.model, self.scope, block)
        hashes = tuple(block_hashes(seed, token_ids[: usable * block], block))
        hits = [await service.claim(self.session, hashes, self.scope)]
        # Even with no full block to look up: the claim opens each hop's session in
        # the request's scope, so that what it computes is kept at the end.
        hits += await asyncio.gather(
            *(
                self._claim_hop(index, hop, hashes)
                for index, hop in enumerate(self.request.hops[1:])
            )
        )
        start = agreed(hits) * block
        service.settle(self.session, start)
        self.first_position = start
        return start

    async def _claim_hop(self, index: int, hop: PlanHop, hashes: tuple[str, ...]) -> Hit:
        """Hop ``index`` (into hops[1:])'s claim: the blocks it holds, or HopFailed."""
        if index not in self.contacted:
            self.contacted.append(index)
        limit = self.service.step_timeout
        try:
            answer = await self.links.to(hop.endpoint).claim(
                self.session_id,
                start=hop.start_layer,
                end=hop.end_layer,
                reserve=self.reserve,
                hashes=hashes,
                capability=self.capabilities[index],
                plan=self.plan_header,
                timeout=limit,
            )
        except LinkTimeout as error:
            raise HopFailed(
                hop, f"did not answer the claim within {limit:g} s", code=HOP_TIMED_OUT
            ) from error
        except LinkDropped as error:
            logger.warning("hop %s: %s", hop.node_id, error)
            raise HopFailed(hop, str(error)) from error
        if answer.status == 503:
            raise HopFailed(hop, f"{_status_of(hop, answer, 'node_busy')}", busy=True)
        if answer.status != 200:
            _status_of(hop, answer, relayable_code(answer.code))
            return Hit(0, True)  # it opens its session with the first step, from position 0
        blocks = answer.blocks
        if not is_count(blocks) or blocks > len(hashes) or not isinstance(answer.exact, bool):
            raise HopFailed(hop, "answered a claim with other than a count of its blocks")
        return Hit(blocks, answer.exact)

    def _kept_chain(self) -> tuple[str, ...] | None:
        """The chain of every token this generation's sessions ran, when they may be kept."""
        if not (self.clean and self.scope):
            return None
        block = self.service.store.prefix.block
        held = self.ran[: self.session.position]
        seed = chain_seed(self.request.model, self.scope, block)
        return tuple(block_hashes(seed, held, block)[:PREFIX_MAX_BLOCKS])

    def _release(self) -> None:
        """Free this session here and on every hop it reached (also on cancel); a generation
        that ended cleanly leaves its state in every node's prefix cache."""
        keep = self._kept_chain()
        if keep:
            self.service.end(self.session_id, keep)
        else:
            self.service.cancel(self.session_id)
        contacted = list(self.contacted)
        if contacted:
            task = asyncio.get_running_loop().create_task(self._cancel_hops(contacted, keep))
            _background.add(task)
            task.add_done_callback(_background.discard)

    async def _cancel_hops(self, contacted: list[int], keep: tuple[str, ...] | None) -> None:
        for index in contacted:
            hop = self.request.hops[index + 1]
            # On failure the hop's idle reaper frees the session.
            with contextlib.suppress(LinkError):
                await self.links.to(hop.endpoint).cancel(
                    self.session_id,
                    capability=self.capabilities[index],
                    timeout=CANCEL_SECONDS,
                    keep=keep or None,
                )


def _delivered(drafts: list[int], choice: Choice) -> list[Choice]:
    """A step's delivered tokens: the drafts ``choice`` accepted, each with its score when
    logprobs were asked, then its own token."""
    kept = drafts[: choice.accepted]
    scores: Sequence[TokenScore | None] = choice.accepted_scores or [None] * len(kept)
    return [*(Choice(token, score) for token, score in zip(kept, scores, strict=True)), choice]


def _status_of(hop: PlanHop, answer: StepAnswer, code: str | None) -> str:
    """``status <n>`` and the hop's error code when it looks like one; the rest is logged."""
    logger.warning("hop %s answered %d: %r", hop.node_id, answer.status, answer.message[:300])
    return f"status {answer.status}" + (f" ({code})" if code else "")


def _hidden_of(hop: PlanHop, answer: StepAnswer, shape: tuple[int, int, int]) -> tuple[bytes, str]:
    """A middle hop's answer, checked before it is relayed (``hop_answers.hidden_of``)."""
    try:
        return hidden_of(answer, shape)
    except BadAnswer as error:
        raise HopFailed(hop, str(error)) from error


_background: set[asyncio.Task[None]] = set()
