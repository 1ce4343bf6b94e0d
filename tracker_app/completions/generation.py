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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from nodes_app.protocol.frames import ChunkFrame
from nodes_app.protocol.logprobs import TokenLogprob
from nodes_app.protocol.sampling import SamplingParams
from nodes_app.protocol.usage import Usage
from routing_app.choice import RouteDecision
from routing_app.planner import Hop
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


@dataclass
class Generation:
    """One choice: its prompt, its sampling, and everything produced for it so far."""

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
    prompt_tokens: int = 0  # billed: the tracker's count (at most the head's if inexact)
    segments: list[Segment] = field(default_factory=list)
    failovers: int = 0
    echoed: bool = False

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

    def sent(self) -> None:
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

    def echo(self, frame: ChunkFrame) -> Piece:
        """The prompt itself, given back before the completion (a legacy ``echo``), once:
        with its tokens' logprobs when ``frame`` (the head's first) carries them."""
        self.echoed = True
        self.prompt_logprobs = frame.prompt_logprobs or ()
        text = self.prompt if isinstance(self.prompt, str) else ""
        return Piece(self.choice, text=text, logprobs=self.prompt_logprobs, echo=True)

    def absorb(self, frame: ChunkFrame, *, request_id: str) -> Piece | None:
        """Take one head frame of the current segment; the piece it gives the client, if any."""
        segment = self.segments[-1]
        self.token_ids += frame.token_ids
        segment.produced += len(frame.token_ids)
        if frame.usage is not None:
            # The tracker counts prompt and completion tokens itself; nodes report, not bill.
            self._check_usage(frame.usage, request_id=request_id)
            self.prompt_tokens = self.prompt_count.billable(frame.usage.prompt_tokens)
        if frame.finish_reason:
            self.finish_reason = frame.finish_reason
        self.logprobs += frame.logprobs
        if not frame.content and not frame.logprobs:
            return None
        self.texts.append(frame.content)
        return Piece(self.choice, text=frame.content, logprobs=frame.logprobs)

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
