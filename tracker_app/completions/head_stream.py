"""Sending one head its ``/v1/generate`` request, reading its stream, and what each way
it can go wrong means.

:func:`head_request` builds and signs what a head is sent: a choice's first
send, and (given the tokens to resume from) a failover's replay
(:func:`~tracker_app.completions.failover.replay_request`). :func:`head_stream`
sends a :class:`~nodes_app.protocol.generate.GenerateRequest` to its hop 0
and yields the head's chunk frames as they arrive. It ends normally only
after a frame with a ``finish_reason``; otherwise it raises one of three
things, each asking the caller for a different response:

- :class:`HeadRefused` (a domain error, 400 or 413): the head refused the
  request itself (too long for the context, a template that rejects the
  messages, a body past its caps): the client's to fix, no node to ban. A
  head answers 4xx only for its requester's fault (ADR-0002). A 413 refuses
  the body's size against the head's own cap (``runnode
  --max-request-bytes``), which the tracker does not know: always the
  client's. Any other 400 — ``prompt_too_long`` included — is the client's
  only when the tracker could not check the prompt itself (``prompt_checked``
  false): a head that refuses a request the tracker validated — sampling in
  range, a prompt it counted and found fitting, within the characters every
  head must take (``GENERATE_MAX_PROMPT_CHARS``) — is lying or broken, a
  :class:`HopFailure`. One sampling field the tracker cannot check whole: a
  ``logit_bias`` id past the vocabulary, which only a node knows; a
  ``bad_sampling`` refusal of a request with a ``logit_bias`` is the
  client's.
- :class:`RouteBusy`: a node of the route says it is at its session cap (the
  head's 503, or a ``hop_busy`` frame): wait for a slot, ban nobody — unless
  the claim does not hold up (:mod:`~tracker_app.completions.busy_claims`).
- :class:`HopFailure`: a node of the route failed (connection error, any
  other status, an error frame, a malformed frame, a stream that ends before
  the last token, a head silent past :func:`silence_limit`, more ``: step``
  comments than tokens it may produce): ban ``node_id`` and fail over.

A hop that hangs downstream is the head's to report (it gives each hop one
step deadline, ``protocol.limits.step_time_limit``): the tracker waits for the head
longer than that, so the blame lands on the hop and not on the head.

A node's words never reach a client: messages name the node, an HTTP status
and at most an error code of the protocol's form (``relayable_code``); the
head's own text (a body, an error frame's message) is logged, truncated,
for operators.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import cast

import httpx
from django.conf import settings
from rest_framework import status

from meshnet_site.errors import DomainError, ErrorKind
from nodes_app.plans import plan_sign
from nodes_app.protocol.decoding import json_document
from nodes_app.protocol.errors import BAD_GRAMMAR, HOP_TIMED_OUT, ProtocolError, relayable_code
from nodes_app.protocol.frames import ChunkFrame, ErrorFrame, parse_frame
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.limits import GENERATE_MAX_PROMPT_CHARS, step_time_limit
from nodes_app.protocol.signed_plan import PlanHop
from nodes_app.protocol.sse import SSE_DONE, sse_data
from tracker_app.completions.generation import Generation
from tracker_app.completions.parameters import GenerationParams

logger = logging.getLogger(__name__)

# How much of a node's own text an operator's log line keeps.
LOGGED_DETAIL_CHARS = 300

UPSTREAM_CONNECT_SECONDS = 5.0
UPSTREAM_WRITE_SECONDS = 30.0
# The statuses a head refuses a client's fault with (see _clients_fault), as the client sees them.
CLIENT_FAULTS = {
    status.HTTP_400_BAD_REQUEST: ErrorKind.INVALID,
    status.HTTP_413_REQUEST_ENTITY_TOO_LARGE: ErrorKind.TOO_LARGE,
}
# A head's 400 code refusing the request's size against its own byte cap (runnode
# --max-request-bytes): the client's, even for a prompt the tracker counted.
SIZE_REFUSALS = frozenset({"request_too_large"})
# A head's 400 codes refusing what the tracker checks on every request with the
# same rule before sending it: the head's fault, whether or not the prompt was counted
# (but for a logit_bias: the tracker has no vocabulary to check its token ids against).
TRACKER_CHECKED = frozenset({"bad_sampling"})
# The head's body is read as sent: never compressed.
IDENTITY = {"Accept-Encoding": "identity"}
# At most this much of a head's error answer is read.
MAX_REFUSAL_BYTES = 64 * 1024
# The longest line of a head's stream read before it ends: no honest frame comes
# near it (the largest, an echo's first, holds at most ECHO_MAX_SCORES logprobs; a
# hop link's frames are held to the same 64 MiB). A longer one is the head's fault,
# so a head cannot make the tracker hold a line without end.
MAX_LINE_BYTES = 64 * 2**20


class HopFailure(Exception):
    """A node of the route failed; the proxy bans ``node_id`` and fails over.

    ``message`` is safe to show a client: it holds no text a node wrote.
    """

    def __init__(self, node_id: str, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.message = message
        self.code = code

    @property
    def grammar_unfollowed(self) -> bool:
        """The node could not follow the request's grammar (``bad_grammar``): the
        request fails, and nobody is banned for it."""
        return self.code == BAD_GRAMMAR


class RouteBusy(Exception):
    """``node_id`` (the head, or the hop its ``hop_busy`` frame names) says it is at its
    session cap: wait for a slot, ban nobody while the claim holds up."""

    def __init__(self, node_id: str) -> None:
        super().__init__(f"node {node_id} is busy")
        self.node_id = node_id


def silence_limit(*, step_timeout: float, hops: int, positions: int, echo: bool = False) -> float:
    """The longest a head of a ``hops``-hop route may send nothing, in seconds.

    Each step the head runs its own layers, then sends the step to each hop in
    turn, each with ``step_time_limit`` to answer (``positions``: the prefill's,
    the longest step; an ``echo``'s prefill gives the route's last node longer);
    a head streams a frame or a comment after every step. One limit more lets
    the head report a hop it gave up on before the tracker gives up on the head.
    """
    each = step_time_limit(step_timeout, positions)
    return hops * each + step_time_limit(step_timeout, positions, echo=echo)


def head_request(
    generation: Generation,
    *,
    params: GenerationParams,
    request_id: str,
    lasts: float | None = None,
    resume_token_ids: Sequence[int] = (),
    echo: bool | None = None,
) -> GenerateRequest:
    """What the head of ``generation``'s current route is sent: its prompt, and the tokens
    it resumes from (``resume_token_ids``: none on a first send), the prompt's scores
    asked when ``echo`` (by default when the request scores its prompt). Signed afresh
    for every send, as a retry or a failover opens new sessions; kept as
    ``generation.sent``. The plan lets each hop hold what this send needs by the
    tracker's own count of the prompt, for as long as the tracker waits for it and
    never past ``lasts`` seconds, what the request's deadline leaves
    (``nodes_app.plans.plan_sign``)."""
    plan = generation.route.plan
    prompt = generation.prompt
    request = GenerateRequest(
        request_id=request_id,
        model=plan.model_key,
        hops=tuple(
            PlanHop(hop.node_id, hop.endpoint, hop.start_layer, hop.end_layer) for hop in plan.hops
        ),
        messages=[] if isinstance(prompt, str) else prompt,
        prompt=prompt if isinstance(prompt, str) else None,
        max_tokens=params.max_tokens,
        sampling=generation.sampling,
        stop=params.stop,
        resume_token_ids=list(resume_token_ids),
        logprobs=params.logprobs,
        top_logprobs=params.top_logprobs,
        echo=params.prompt_scored if echo is None else echo,
        tools=[dict(tool) for tool in params.template_tools],
        prefix_scope=generation.prefix_scope,
        speculation=params.speculation,
    )
    silence = silence_limit(
        step_timeout=settings.MESHNET_HOP_STEP_TIMEOUT,
        hops=len(plan.hops),
        positions=generation.prompt_count.tokens + len(resume_token_ids),
        echo=request.echo,
    )
    signed = plan_sign(
        request, prompt_tokens=generation.prompt_count.tokens, silence=silence, lasts=lasts
    )
    generation.sent = signed
    return signed


class GrammarNotFollowed(DomainError):
    """A node of the route could not follow a grammar the tracker judged followable:
    the request fails (400, unbilled) and the node keeps its standing."""

    kind = ErrorKind.INVALID
    code = BAD_GRAMMAR


class HeadRefused(DomainError):
    """The head refused the request as invalid; ``code`` is the head's own when it
    has the protocol's form. The message names the node, never the head's text."""

    kind = ErrorKind.INVALID


async def head_stream(
    *,
    client: httpx.AsyncClient,
    request: GenerateRequest,
    silence: float,
    on_connected: Callable[[], Awaitable[None]] | None = None,
    prompt_checked: bool = False,
) -> AsyncGenerator[ChunkFrame, None]:
    """:func:`head_batches`'s frames one by one."""
    batches = head_batches(
        client=client,
        request=request,
        silence=silence,
        on_connected=on_connected,
        prompt_checked=prompt_checked,
    )
    async with aclosing(batches):
        async for frames in batches:
            for frame in frames:
                yield frame


async def head_batches(
    *,
    client: httpx.AsyncClient,
    request: GenerateRequest,
    silence: float,
    on_connected: Callable[[], Awaitable[None]] | None = None,
    prompt_checked: bool = False,
) -> AsyncGenerator[list[ChunkFrame], None]:
    """The head's frames for ``request``, up to and including the one that finishes it,
    in batches: the frames of one read of the head's connection (several when the
    tracker fell behind the head), so that they can reach the client in one write.

    ``silence``: the seconds the head may send nothing (its answer, then
    between frames; see :func:`silence_limit`) before it is taken for hung.
    ``on_connected`` runs once the head has accepted the request (200),
    before its first frame. ``prompt_checked``: the tracker tokenised the
    prompt with the model's tokenizer and found it fits, so the head has no
    reason to refuse it. Raises :class:`HeadRefused`, :class:`RouteBusy`
    or :class:`HopFailure` as the module docstring says; a head that sends
    more tokens than ``max_tokens`` allows, or blames a node outside the
    plan, is itself the one that failed.
    """
    head = request.hops[0]
    reader = _FrameReader(request)
    finished = False
    try:
        async with client.stream(
            "POST",
            f"{head.endpoint}/v1/generate",
            json=request.to_json(),
            headers=IDENTITY,
            timeout=httpx.Timeout(
                silence,
                connect=UPSTREAM_CONNECT_SECONDS,
                write=UPSTREAM_WRITE_SECONDS,
                pool=UPSTREAM_WRITE_SECONDS,
            ),
        ) as response:
            if response.status_code == status.HTTP_503_SERVICE_UNAVAILABLE:
                raise RouteBusy(head.node_id)
            if response.status_code != status.HTTP_200_OK:
                body = await _read_at_most(response, MAX_REFUSAL_BYTES)
                code = _error_code(head.node_id, response.status_code, body)
                kind = _clients_fault(
                    response.status_code,
                    code,
                    prompt_checked=prompt_checked
                    and request.prompt_characters <= GENERATE_MAX_PROMPT_CHARS,
                    sampling_checked=not request.sampling.logit_bias,
                )
                if kind is not None:
                    raise _refusal(head.node_id, code, kind=kind)
                raise HopFailure(
                    head.node_id,
                    f"head answered HTTP {response.status_code}" + (f" ({code})" if code else ""),
                )
            if on_connected is not None:
                await on_connected()
            split = _LineSplitter(head.node_id)
            async for chunk in _body(response):
                if finished:
                    continue  # read on to the end, so the connection is kept alive
                lines = split.lines(chunk)
                if not lines:
                    continue
                frames, ending = reader.frames(lines)
                finished = reader.finished
                if frames:
                    yield frames  # those before a line that ends the stream go first
                if ending is not None:
                    raise ending
            if (rest := split.rest()) and not finished:
                frames, ending = reader.frames([rest])
                finished = reader.finished
                if frames:
                    yield frames
                if ending is not None:
                    raise ending
    except httpx.ReadTimeout as error:
        if finished:
            return
        raise HopFailure(
            head.node_id, f"the head sent nothing for {silence:g} s ({HOP_TIMED_OUT})"
        ) from error
    except httpx.HTTPError as error:
        if finished:
            return  # the answer was complete; only the connection's close failed
        # The exception's text names the endpoint, which clients are not shown.
        _log_detail(head.node_id, "could not be read", str(error))
        raise HopFailure(head.node_id, type(error).__name__) from error
    if not finished:
        raise HopFailure(head.node_id, "the head's stream ended before the last token")


class _LineSplitter:
    """A head's body, as read, cut into whole lines; the line not ended yet is kept in
    pieces (joined once, when it ends) and bounded by :data:`MAX_LINE_BYTES`."""

    def __init__(self, head: str) -> None:
        self.head = head
        self.pieces: list[bytes] = []
        self.size = 0

    def lines(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` ends (none if it ends none). Raises :class:`HopFailure`
        once the line being read is longer than the bound."""
        if b"\n" not in chunk:
            self.pieces.append(chunk)
            self.size += len(chunk)
            if self.size > MAX_LINE_BYTES:
                raise HopFailure(self.head, f"sent a line over {MAX_LINE_BYTES} bytes")
            return []
        lines = chunk.split(b"\n")
        if self.pieces:
            lines[0] = b"".join([*self.pieces, lines[0]])
        tail = lines.pop()
        self.pieces, self.size = ([tail], len(tail)) if tail else ([], 0)
        return lines

    def rest(self) -> bytes:
        """What came after the last line's end."""
        return b"".join(self.pieces)


def _body(response: httpx.Response) -> AsyncIterable[bytes]:
    """``response``'s body as it is read, in the chunks read.

    The lines are split by the caller: httpx's line reader (``aiter_lines``) and
    the layers under it (text decoder, chunkers, the byte counter) cost a
    relayed token more than the split. A body that is not encoded (the head is
    asked for ``identity``) is read from the response's stream itself.
    """
    if response.headers.get("content-encoding", "identity") != "identity":
        return response.aiter_bytes()
    return cast(AsyncIterable[bytes], response.stream)


class _FrameReader:
    """The frames of one head's stream, line by line, each checked against its request."""

    def __init__(self, request: GenerateRequest) -> None:
        self.request = request
        self.head = request.hops[0].node_id
        self.route = {hop.node_id for hop in request.hops}
        self.tokens = len(request.resume_token_ids)
        # Each ``: step`` comment stands for one token produced whose text is held back:
        # a head may send at most as many as it may produce tokens.
        self.comments_left = request.max_tokens - self.tokens
        self.finished = False  # a frame with a finish_reason came: the rest is not read

    def frames(self, lines: list[bytes]) -> tuple[list[ChunkFrame], HopFailure | RouteBusy | None]:
        """The chunk frames of ``lines``, up to the one that finishes the stream, and what
        ends the stream at a line if one does (the frames before it stand)."""
        frames: list[ChunkFrame] = []
        for line in lines:
            try:
                frame = self.frame(line)
            except (HopFailure, RouteBusy) as ending:
                return frames, ending
            if frame is not None:
                frames.append(frame)
                if frame.finish_reason is not None:
                    self.finished = True
                    break
        return frames, None

    def frame(self, raw: bytes) -> ChunkFrame | None:
        """The chunk frame ``raw`` (one line, its end cut) holds; None for a line that holds
        none (a blank line, a comment, ``[DONE]``). Raises :class:`RouteBusy` or
        :class:`HopFailure` for a line that ends the stream."""
        line = raw.removesuffix(b"\r").decode(errors="replace")
        if line.startswith(":"):
            self.comments_left -= 1
            if self.comments_left < 0:
                raise HopFailure(
                    self.head,
                    "malformed stream: more step comments than the "
                    f"{self.request.max_tokens} tokens asked",
                )
            return None
        try:
            payload = sse_data(line)
            if payload is None or payload == SSE_DONE:
                return None
            frame = parse_frame(payload)
        except ProtocolError as error:
            _log_detail(self.head, "sent a malformed frame", str(error))
            raise HopFailure(self.head, "malformed frame") from error
        if isinstance(frame, ErrorFrame):
            if frame.busy:
                raise RouteBusy(frame.node_id if frame.node_id in self.route else self.head)
            # The head may only blame a node of this route; otherwise it is at fault.
            blamed = frame.node_id if frame.node_id in self.route else self.head
            _log_detail(self.head, f"reported node {blamed} failed", frame.message)
            code = relayable_code(frame.code) or "hop_failed"
            raise HopFailure(blamed, f"node {blamed} failed ({code})", code=code)
        self.tokens += len(frame.token_ids)
        if self.tokens > self.request.max_tokens:
            raise HopFailure(
                self.head,
                f"malformed frame: the head sent more than the {self.request.max_tokens} "
                "tokens asked",
            )
        return frame


def _clients_fault(
    status_code: int, code: str | None, *, prompt_checked: bool, sampling_checked: bool
) -> ErrorKind | None:
    """How the client sees a head's refusal if it is the client's fault; None if the head's.

    A 413 or a 400 ``request_too_large`` refuses the request's size against the
    head's own byte cap, which the tracker cannot check: the client's. A 400
    ``bad_sampling`` refuses what the tracker already checked with the very same
    rule (``SamplingParams.from_mapping``): the head's, unless the sampling holds
    what only a node can check (``sampling_checked`` false: a logit_bias's token
    ids). A 400 ``bad_grammar`` is the client's: the tracker judged the grammar as
    the last hop uses it, and a node's library may judge otherwise. Any other 400,
    ``prompt_too_long`` included, is the client's unless the tracker counted the
    prompt and found it fitting (``prompt_checked``).
    """
    kind = CLIENT_FAULTS.get(status_code)
    if kind is None:
        return None
    if status_code == status.HTTP_413_REQUEST_ENTITY_TOO_LARGE or code in SIZE_REFUSALS:
        return kind
    if code == BAD_GRAMMAR:  # a grammar the tracker judged followable: nobody's fault
        return kind
    if code in TRACKER_CHECKED:
        return None if sampling_checked else kind
    if prompt_checked:
        return None
    return kind


async def _read_at_most(response: httpx.Response, limit: int) -> bytes:
    body = b""
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= limit:
            break
    return body[:limit]


def _log_detail(node_id: str, what: str, detail: str) -> None:
    logger.warning("node %s %s: %r", node_id, what, detail[:LOGGED_DETAIL_CHARS])


def _error_code(node_id: str, status_code: int, body: bytes) -> str | None:
    """The error code of a node's error body if it has the protocol's form; the body is logged."""
    _log_detail(node_id, f"answered HTTP {status_code}", body.decode(errors="replace"))
    try:
        return relayable_code(json_document(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def _refusal(node_id: str, code: str | None, *, kind: ErrorKind) -> HeadRefused:
    code = code or ("request_too_large" if kind is ErrorKind.TOO_LARGE else "invalid_request")
    if code in TRACKER_CHECKED:
        # All the tracker could not check of the sampling is a logit_bias's token ids.
        return HeadRefused(
            f"Node {node_id} refused the request ({code}): a logit_bias token id is not in "
            "the model's vocabulary",
            code=code,
            kind=kind,
            param="logit_bias",
        )
    return HeadRefused(f"Node {node_id} refused the request ({code})", code=code, kind=kind)
