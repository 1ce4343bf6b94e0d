"""The head drives a generation along its route and streams OpenAI chat chunks.

Each step runs the head's own layers, then sends the hidden states to every
downstream hop in order, each over the head's persistent link to that hop
(``links``; binary frames, see ``wire``): the hop that ends at the last layer
samples and answers with the token. Steps of different generations that are
ready together share a frame on each link, but every generation keeps its own
loop, sessions, cancel and failover. The
first step is the prefill (the templated prompt plus any resumed tokens); each
later step sends one position. Every hop keeps its own KV cache for the
session, freed at the end, on cancel, on failure, and by the idle reaper.

Each hop session gets a capability of its own, chosen here; the step that
opens it carries the tracker's signed plan as well (see ``trust``). A hop's
error is reported by its node id, status and error code only: its message
is the hop's to write, goes to this node's log, and never reaches the
tracker or a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

from nodes_app.prompting import TemplateRefused, prompt_token_ids, text_token_ids
from nodes_app.protocol import (
    ECHO_MAX_SCORES,
    HOP_BUSY,
    HOP_FAILED,
    HOP_TIMED_OUT,
    SSE_DONE,
    SSE_STEP_COMMENT,
    ChunkFrame,
    ErrorFrame,
    GenerateRequest,
    PlanHop,
    TokenLogprob,
    TopLogprob,
    Usage,
    echo_scores,
    relayable_code,
    sse_event,
    step_time_limit,
)
from nodes_app.runtime import wire
from nodes_app.runtime.errors import NonFiniteOutput, RuntimeRequestError
from nodes_app.runtime.links import HopLinks, LinkDropped, LinkError, LinkTimeout
from nodes_app.runtime.sampling import Choice, TailRequest, TokenScore
from nodes_app.runtime.service import NodeService
from nodes_app.runtime.text import IncrementalDetokenizer, StopMatcher
from nodes_app.runtime.trust import capability_hash, new_capability

logger = logging.getLogger("meshnet.node")

# How long the head waits for a hop to answer the cancel of a session.
CANCEL_SECONDS = 5.0


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
    tokenizer's added token) or an echo too large to report is a 400.
    """
    tokenizer = service.shard.tokenizer
    text = request.prompt
    try:
        if text is not None:
            prompt = await service.compute(lambda: text_token_ids(tokenizer, text))
        else:
            prompt = await service.compute(lambda: prompt_token_ids(tokenizer, request.messages))
    except TemplateRefused as error:  # the chat template's own complaint, e.g. role order
        raise RuntimeRequestError(error.message, code="invalid_request") from error
    if not prompt:
        raise RuntimeRequestError("the prompt has no tokens", code="invalid_request")
    # A tokenizer may add tokens the model has no row for: run, such an id would
    # crash this head's embedding, or make it blame the honest tail that refused it.
    vocab = service.vocab_size
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
    if needed > service.context_length:
        raise RuntimeRequestError(
            f"the prompt ({len(prompt)} tokens) plus max_tokens ({request.max_tokens}) exceeds "
            f"the model's context of {service.context_length} tokens",
            code="context_length_exceeded",
        )
    return prompt


def eos_token_ids(service: NodeService) -> set[int]:
    ids: set[int] = set()
    configured = getattr(service.shard.config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list):
        ids.update(int(i) for i in configured)
    tokenizer = service.shard.tokenizer
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


class Generation:
    """One ``/v1/generate`` call on the head; iterate :meth:`stream` for SSE frames."""

    def __init__(
        self,
        service: NodeService,
        links: HopLinks,
        request: GenerateRequest,
        prompt: list[int],
    ):
        self.service = service
        self.links = links
        self.request = request
        self.prompt = prompt
        self.session_id = f"{request.request_id}.{uuid.uuid4().hex[:12]}"
        self.completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        head = request.hops[0]
        # Positions the generation may reach: what each node reserves of its KV budget.
        self.reserve = len(prompt) + request.max_tokens
        # Opened now, so a full node answers 503 before the stream starts. Its
        # capability is known to nobody: only this generation frees it.
        self.session = service.open_session(
            self.session_id,
            0,
            head.end_layer,
            capability=capability_hash(new_capability()),
            reserve=self.reserve,
        )
        # Indexes (into hops[1:]) of the hops that may hold a session of this generation.
        self.contacted: list[int] = []
        # One capability per hop session; the signed plan opens each of them.
        self.capabilities = [new_capability() for _ in request.hops[1:]]
        self.plan_header = request.plan.to_header() if request.signature else None

    def _event(self, frame: ChunkFrame) -> bytes:
        return frame.event(
            completion_id=self.completion_id, created=self.created, model=self.request.model
        )

    async def stream(self) -> AsyncIterator[bytes]:
        self.service.streams += 1
        try:
            async for frame in self._frames():
                yield frame
        finally:
            self.service.streams -= 1
            self._release()

    async def _frames(self) -> AsyncIterator[bytes]:
        request, tokenizer, prompt = self.request, self.service.shard.tokenizer, self.prompt
        resumed = request.resume_token_ids
        budget = request.max_tokens - len(resumed)
        detokenizer = IncrementalDetokenizer(tokenizer, resumed)
        stopper = StopMatcher(request.stop)
        eos = eos_token_ids(self.service)
        if not request.echo:
            yield self._event(ChunkFrame(role="assistant"))
        step_ids, produced = prompt + resumed, 0
        # Token ids not yet streamed, and their logprob entries (with ``logprobs``).
        unsent: list[int] = []
        entries: list[TokenLogprob] = []
        # An echo runs the prompt even when no token is asked for (max_tokens 0).
        finish = "length" if budget <= 0 and not request.echo else None
        while finish is None:
            try:
                choice = await self._step(step_ids, self._tail(opening=produced == 0))
            except HopFailed as failure:
                error = ErrorFrame(
                    message=f"hop {failure.hop.node_id} failed: {failure.message}",
                    code=failure.code,
                    node_id=failure.hop.node_id,
                )
                yield sse_event(error.to_json())
                yield sse_event(SSE_DONE)
                return
            if produced == 0 and request.echo:
                # Up to ECHO_MAX_SCORES values to write: built off the event loop.
                yield await asyncio.to_thread(self._echo_event, choice)
                if budget <= 0:
                    finish = "length"
                    break
            token = choice.token_id
            produced += 1
            step_ids = [token]
            unsent.append(token)
            if request.logprobs:
                assert choice.score is not None
                entries.append(self._entry(token, choice.score))
            if token in eos:
                finish = "stop"
                break
            text = stopper.feed(detokenizer.push(token))
            if stopper.stopped:
                finish = "stop"
            elif produced >= budget:
                finish = "length"
            if text:
                yield self._event(
                    ChunkFrame(content=text, token_ids=tuple(unsent), logprobs=tuple(entries))
                )
                unsent, entries = [], []
            elif finish is None:
                yield SSE_STEP_COMMENT
        tail = "" if stopper.stopped else stopper.feed(detokenizer.flush()) + stopper.flush()
        usage = Usage(prompt_tokens=len(prompt), completion_tokens=len(resumed) + produced)
        yield self._event(
            ChunkFrame(
                content=tail,
                token_ids=tuple(unsent),
                finish_reason=finish,
                usage=usage,
                logprobs=tuple(entries),
            )
        )
        yield sse_event(SSE_DONE)

    def _tail(self, *, opening: bool) -> TailRequest:
        """What the last hop does with this generation's step (the prefill when ``opening``)."""
        request = self.request
        return TailRequest(
            request.sampling,
            logprobs=request.top_logprobs if request.logprobs else None,
            prompt_ids=tuple(self.prompt) if opening and request.echo else (),
            generated_ids=(
                tuple(request.resume_token_ids) if opening and request.sampling.penalized else ()
            ),
        )

    def _entry(self, token_id: int, score: TokenScore) -> TokenLogprob:
        """A token's logprob entry, written as ``protocol.TokenLogprob`` says."""
        pieces = self.service.pieces
        token, raw = pieces(token_id)
        top = []
        for alternative, logprob in score.top:
            written, alternative_raw = pieces(alternative)
            top.append(TopLogprob(written, logprob, tuple(alternative_raw)))
        return TokenLogprob(token, score.logprob, tuple(raw), tuple(top))

    def _echo_event(self, choice: Choice) -> bytes:
        """The first event of an echo: the role, the prompt's ids and their logprob entries.

        Run on a worker thread (see :meth:`ChunkFrame.event`).
        """
        prompt = self.prompt
        token, raw = self.service.pieces(prompt[0])
        entries = [TokenLogprob(token, None, tuple(raw))]
        entries += [
            self._entry(token_id, score)
            for token_id, score in zip(prompt[1:], choice.prompt, strict=True)
        ]
        return self._event(
            ChunkFrame(
                role="assistant", prompt_token_ids=tuple(prompt), prompt_logprobs=tuple(entries)
            )
        )

    async def _step(self, token_ids: list[int], tail: TailRequest) -> Choice:
        """One position (or the prefill) through every hop; the last hop's choice.

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
            step = wire.ForwardStep(
                session_id=self.session_id,
                start=hop.start_layer,
                end=hop.end_layer,
                position=position,
                dtype=dtype,
                shape=shape,
                # The tail's session keeps the sampling it opened with.
                sampling=tail.sampling if last and position == 0 else None,
                sender=hops[index - 1].node_id,
                reserve=self.reserve if position == 0 else None,
                logprobs=tail.logprobs if last else None,
                prompt_ids=tail.prompt_ids if last and tail.prompt_ids else None,
                generated_ids=tail.generated_ids if last and tail.generated_ids else None,
                token_ids=tuple(token_ids) if service.shard.family.per_layer_inputs else None,
            )
            try:
                answer = await self.links.to(hop.endpoint).step(
                    step,
                    payload,
                    capability=self.capabilities[index - 1],
                    plan=self.plan_header if position == 0 else None,
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
            if answer.status != 200:
                code = relayable_code(answer.code)
                # A hop refusing non-finite input blames whoever computed it.
                blamed = hops[index - 1] if code == "non_finite_input" else hop
                raise HopFailed(
                    blamed,
                    f"{_status_of(hop, answer, code)} from {hop.node_id}",
                    busy=answer.status == 503,
                )
            if last:
                if tail.prompt_ids:  # an echo's answer: up to ECHO_MAX_SCORES values to check
                    return await asyncio.to_thread(self._choice_of, hop, answer, tail)
                return self._choice_of(hop, answer, tail)
            payload, dtype = _hidden_of(hop, answer, shape)
        raise AssertionError("the plan's last hop ends at the last layer")

    def _choice_of(self, hop: PlanHop, answer: wire.StepAnswer, tail: TailRequest) -> Choice:
        """The last hop's choice, holding what ``tail`` asked for, or that hop is at fault."""
        try:
            return wire.choice_of(
                answer,
                vocab=self.service.vocab_size,
                logprobs=tail.logprobs,
                prompt_scores=max(0, len(tail.prompt_ids) - 1),
            )
        except wire.BadAnswer as error:
            raise HopFailed(hop, str(error)) from error

    def _release(self) -> None:
        """Free this session here and on every hop it reached (also on cancel)."""
        self.service.cancel(self.session_id)
        contacted = list(self.contacted)
        if contacted:
            task = asyncio.get_running_loop().create_task(self._cancel_hops(contacted))
            _background.add(task)
            task.add_done_callback(_background.discard)

    async def _cancel_hops(self, contacted: list[int]) -> None:
        for index in contacted:
            hop = self.request.hops[index + 1]
            # On failure the hop's idle reaper frees the session.
            with contextlib.suppress(LinkError):
                await self.links.to(hop.endpoint).cancel(
                    self.session_id, capability=self.capabilities[index], timeout=CANCEL_SECONDS
                )


def _status_of(hop: PlanHop, answer: wire.StepAnswer, code: str | None) -> str:
    """``status <n>`` and the hop's error code when it looks like one; the rest is logged."""
    logger.warning("hop %s answered %d: %r", hop.node_id, answer.status, answer.message[:300])
    return f"status {answer.status}" + (f" ({code})" if code else "")


def _hidden_of(
    hop: PlanHop, answer: wire.StepAnswer, shape: tuple[int, int, int]
) -> tuple[bytes, str]:
    """A middle hop's answer, checked before it is relayed: its bytes and dtype.

    The answer must have the step's shape, a float dtype, the length they
    give and only finite values; otherwise the hop that answered is at fault.
    """
    dtype = answer.dtype or ""
    if dtype not in wire.DTYPES or answer.shape != shape or answer.hidden is None:
        raise HopFailed(hop, "answered hidden states of another shape or dtype")
    try:
        hidden = wire.tensor_from_bytes(answer.hidden, dtype, shape)
    except RuntimeRequestError as error:
        raise HopFailed(hop, f"answered {error.message}") from error
    if not wire.is_finite(hidden):
        raise HopFailed(hop, "answered hidden states that are not finite")
    return answer.hidden, dtype


_background: set[asyncio.Task[None]] = set()
