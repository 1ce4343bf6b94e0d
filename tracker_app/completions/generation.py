"""One choice of a completion request: what it has produced, on which routes.

A request asks for ``n`` choices of each of its prompts
(:class:`~tracker_app.completions.parameters.GenerationParams`); each is a
:class:`Generation` of its own, run by the proxy (:mod:`tracker_app.completions.proxy`)
along a route and, when a node of it fails, resumed on another by replaying
its tokens. A generation takes the head's frames one by one
(:meth:`Generation.absorb`) and keeps its token ids, text and finish reason,
and the routes that served it (:class:`Segment`), which bill the hops' work.
What it gives the client is a :class:`Piece`; the endpoint's answer
(:mod:`~tracker_app.completions.chat_answer`,
:mod:`~tracker_app.completions.text_answer`) turns pieces into its own chunks.

The tracker sees the text it relays, so it holds the head to the client's
limits (:meth:`Generation.absorb`): text never runs past a stop sequence or
``max_tokens``. A head that sends more is cut there, the choice ends, and the
overrun (:class:`Overrun`) quarantines its route (``tracker_app.served_answers``).
A sampled choice the client gave no seed gets one the tracker draws, so the
probe can re-run exactly what a route served (ADR-0007).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nodes_app.protocol.frames import ChunkFrame
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.limits import MAX_STOP_LENGTH
from nodes_app.protocol.logprobs import TokenLogprob
from nodes_app.protocol.sampling import SEED_MAX, SamplingParams
from nodes_app.protocol.usage import Usage
from routing_app.planning.route_plan import Hop
from routing_app.policies.choice import RouteDecision
from tracker_app.billing.pricing import HopWork, request_work
from tracker_app.completions.parameters import Prompt
from tracker_app.completions.prompt_tokens import PromptCount

logger = logging.getLogger(__name__)


@dataclass
class Segment:
    """The part of one generation served by one route."""

    decision: RouteDecision
    replayed: int  # tokens produced earlier and prefilled again on this route
    started: float
    produced: int = 0
    cached: int = 0  # prompt tokens its head reported the route did not recompute
    # Drafts its head reported sending through the route and those accepted (ADR-0028).
    drafted: int = 0
    accepted: int = 0

    @property
    def signature(self) -> str:
        return self.decision.plan.signature

    @property
    def hops(self) -> tuple[Hop, ...]:
        return self.decision.plan.hops


@dataclass(frozen=True)
class Piece:
    """What one choice gives the client at once: text and its tokens' ``logprobs`` (the
    prompt's own with ``echo``), or its end (``finish_reason``)."""

    choice: int
    text: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None
    echo: bool = False


@dataclass(frozen=True)
class Overrun:
    """A head relayed text past the client's stop sequence or ``max_tokens`` on ``segment``'s
    route: the head applies both (``nodes_app.runtime.output``), so it is to blame."""

    segment: Segment
    what: str

    @property
    def node_id(self) -> str:
        return self.segment.decision.plan.head.node_id


@dataclass
class Generation:
    """One choice: its prompt, its sampling, and everything produced for it so far.

    ``sent`` is what its current route's head was last sent
    (:func:`~tracker_app.completions.head_stream.head_request` sets it): the
    stop sequences and budget the relayed text is held to, and what the
    probe re-runs (``tracker_app.served_answers``).
    """

    choice: int
    prompt: Prompt
    prompt_count: PromptCount
    sampling: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    delivered: int = 0  # how many of them the client has been sent
    texts: list[str] = field(default_factory=list)  # the completion's text, chunk by chunk
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token, when asked
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # one per prompt token, with echo
    finish_reason: str = ""
    stop_sequence: str | None = None  # the client's stop sequence that ended it, if one did
    prompt_tokens: int = 0  # billed: the tracker's count (at most the head's if inexact)
    segments: list[Segment] = field(default_factory=list)
    failovers: int = 0
    echoed: bool = False
    sent: GenerateRequest | None = None
    # The prefix scope its plans carry (``prefix_scope``): "" shares no node's cache.
    prefix_scope: str = ""
    overrun: Overrun | None = None
    # The end of the current segment's own text, as much as a stop sequence could
    # still need (a head's stop matcher starts afresh on a new route).
    _segment_text: str = ""
    _segment_count: int = 0

    def __post_init__(self) -> None:
        if not self.sampling.greedy and self.sampling.seed is None:
            # Drawn here rather than by the node: as random for the client, and the
            # probe can re-run the very answer a route served (ADR-0007).
            self.sampling = replace(self.sampling, seed=secrets.randbelow(SEED_MAX + 1))

    @property
    def content(self) -> str:
        return "".join(self.texts)

    @property
    def finished(self) -> bool:
        return bool(self.finish_reason)

    @property
    def delivered_whole(self) -> bool:
        """Finished, and every token of it sent to the client."""
        return self.finished and self.delivered == len(self.token_ids)

    def stopped_by(self, stops: Sequence[str], tokenizer: Any) -> str | None:
        """Which of ``stops`` ended this finished choice, if one did (else the model's
        end of text or ``max_tokens`` did). The head holds a stop sequence's text back,
        so it is read from the tokens: what they spell past the text sent."""
        if self.finish_reason != "stop" or not stops or tokenizer is None:
            return None
        spelled = tokenizer.decode(self.token_ids, skip_special_tokens=True)
        content = self.content
        tail = (
            spelled[len(content) :]
            if spelled.startswith(content)
            else spelled[-MAX_STOP_LENGTH * 2 :]
        )
        found = [(tail.find(stop), stop) for stop in stops if stop in tail]
        return min(found)[1] if found else None

    def mark_delivered(self) -> None:
        """The client has been sent everything this choice produced so far."""
        self.delivered = len(self.token_ids)

    @property
    def route(self) -> RouteDecision:
        """The route serving this choice now."""
        return self.segments[-1].decision

    def prompt_settled(self) -> None:
        """A choice cut short before its head reported usage (its client left) bills
        the tracker's own count of its prompt, or none when that is only a bound (the
        bound would overcharge)."""
        if not self.finished and not self.prompt_tokens and self.prompt_count.exact:
            self.prompt_tokens = self.prompt_count.tokens

    def work(self) -> list[HopWork]:
        """The hops' work for this choice (:func:`~tracker_app.billing.pricing.request_work`)."""
        return request_work(prompt_tokens=self.prompt_tokens, routes=self.segments)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the route that finished this choice did not recompute, as its
        head reported them (a failover's replay counts its own route's), at most the
        billed prompt."""
        if not self.segments:
            return 0
        return min(self.segments[-1].cached, self.prompt_tokens)

    @property
    def speculation(self) -> tuple[int, int]:
        """Drafts this choice's routes sent and accepted, as their heads reported them."""
        return (
            sum(segment.drafted for segment in self.segments),
            sum(segment.accepted for segment in self.segments),
        )

    def echo(self, frame: ChunkFrame) -> Piece:
        """The prompt itself, given back before the completion (a legacy ``echo``), once:
        with its tokens' logprobs when ``frame`` (the head's first) carries them."""
        self.echoed = True
        self.prompt_logprobs = frame.prompt_logprobs or ()
        text = self.prompt if isinstance(self.prompt, str) else ""
        return Piece(self.choice, text=text, logprobs=self.prompt_logprobs, echo=True)

    def absorb(self, frame: ChunkFrame, *, request_id: str) -> Piece | None:
        """Take one head frame of the current segment; the piece it gives the client, if any.

        Nothing more is taken once the head overran the client's limits
        (:attr:`overrun`: the proxy stops reading it then).
        """
        if self.overrun is not None:
            return None
        segment = self.segments[-1]
        if self._segment_count != len(self.segments):
            self._segment_count, self._segment_text = len(self.segments), ""
        frame = self._within_limits(frame, segment)
        self.token_ids += frame.token_ids
        segment.produced += len(frame.token_ids)
        if frame.usage is not None:
            # The tracker counts prompt and completion tokens itself; nodes report, not bill.
            self._check_usage(frame.usage, request_id=request_id)
            self.prompt_tokens = self.prompt_count.billable(frame.usage.prompt_tokens)
            segment.cached = frame.usage.cached_tokens
            segment.drafted = frame.usage.drafted_tokens
            segment.accepted = frame.usage.accepted_tokens
        if frame.finish_reason:
            self.finish_reason = frame.finish_reason
        self.logprobs += frame.logprobs
        if not frame.content and not frame.logprobs:
            return None
        self.texts.append(frame.content)
        return Piece(self.choice, text=frame.content, logprobs=frame.logprobs)

    def _within_limits(self, frame: ChunkFrame, segment: Segment) -> ChunkFrame:
        """``frame`` cut where the client's stop sequence or ``max_tokens`` ends the text.

        An honest head never sends a stop sequence's text (it holds back what
        may begin one) nor a token past the budget: a frame that does is cut
        there, ends the choice and is recorded as the head's :class:`Overrun`.
        The tokens of the frame that holds the stop are kept (a frame does not
        say which of its tokens wrote which characters).
        """
        sent = self.sent
        if sent is None:
            return frame
        room = sent.max_tokens - len(self.token_ids)
        if len(frame.token_ids) > room:
            self.overrun = Overrun(segment, f"sent more than max_tokens ({sent.max_tokens})")
            kept = max(room, 0)
            content = frame.content if kept else ""
            frame = replace(
                frame,
                content=content,
                token_ids=frame.token_ids[:kept],
                logprobs=frame.logprobs[:kept],
                finish_reason="length",
            )
        text = self._segment_text + frame.content
        cut = min((i for i in (text.find(stop) for stop in sent.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.overrun = Overrun(segment, "sent text past the client's stop sequence")
            content = frame.content[: max(cut - len(self._segment_text), 0)]
            frame = replace(frame, content=content, finish_reason="stop")
        # Kept short, so a long answer's check stays linear in its length.
        self._segment_text = (self._segment_text + frame.content)[-MAX_STOP_LENGTH:]
        return frame

    def _check_usage(self, usage: Usage, *, request_id: str) -> None:
        """Log a head whose usage is not what the tracker counted (it is not billed)."""
        produced = len(self.token_ids)
        if self.prompt_count.agrees(usage.prompt_tokens) and usage.completion_tokens == produced:
            return
        logger.warning(
            "request %s choice %d: head %s reported %d prompt and %d completion tokens; the "
            "tracker counted %s%d prompt and %d completion tokens and bills its own count",
            request_id,
            self.choice,
            self.route.plan.head.node_id,
            usage.prompt_tokens,
            usage.completion_tokens,
            "" if self.prompt_count.exact else "at most ",
            self.prompt_count.tokens,
            produced,
        )
