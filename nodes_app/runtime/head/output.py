"""The output processor: the last hop's choices become the head's OpenAI chunk frames.

One per generation, on the head. It detokenises incrementally (a character
split across tokens waits for its last byte), applies the request's stop
sequences and the model's end-of-text tokens, counts the budget, writes
logprob entries as ``protocol.logprobs.TokenLogprob`` says, and frames every chunk
(SSE ``data:`` lines; a step that produced no text yet is a ``: step``
comment, so the tracker sees progress). The route driver
(:mod:`nodes_app.runtime.head.route_driver`) feeds it one choice per step and stops
when :attr:`OutputProcessor.finish` is set.
"""

from __future__ import annotations

import time
import uuid

from nodes_app.protocol.frames import ChunkFrame, ErrorFrame
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.logprobs import TokenLogprob, TopLogprob
from nodes_app.protocol.sse import SSE_DONE, SSE_STEP_COMMENT, sse_event
from nodes_app.protocol.usage import Usage
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.head.text import IncrementalDetokenizer, StopMatcher, token_pieces
from nodes_app.runtime.wire.entries import Choice, TokenScore


def eos_token_ids(service: NodeService) -> set[int]:
    """The ids that end a generation: the config's ``eos_token_id`` (one or a list) and the
    tokenizer's."""
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


class OutputProcessor:
    """Frames of one generation, from its opening role chunk to ``data: [DONE]``.

    ``finish`` is None while the generation goes on, then ``"stop"`` (an
    end-of-text token or a stop sequence) or ``"length"`` (the budget spent).
    """

    def __init__(self, service: NodeService, request: GenerateRequest, prompt: list[int]) -> None:
        self.service = service
        self.request = request
        self.prompt = prompt
        self.completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        resumed = request.resume_token_ids
        # Completion tokens this route may still produce (a resumed request has some).
        self.budget = request.max_tokens - len(resumed)
        self.produced = 0
        # Prompt positions whose state came from the route's prefix caches (ADR-0027).
        self.cached_tokens = 0
        # Drafts sent through the route and accepted by its last hop (ADR-0028).
        self.drafted = 0
        self.accepted = 0
        self._detokenizer = IncrementalDetokenizer(service.shard.tokenizer, resumed)
        self._stopper = StopMatcher(request.stop)
        self._eos = eos_token_ids(service)
        # Token ids not yet streamed, and their logprob entries (with ``logprobs``).
        self._unsent: list[int] = []
        self._entries: list[TokenLogprob] = []
        # An echo runs the prompt even when no token is asked for (max_tokens 0).
        self.finish: str | None = "length" if self.budget <= 0 and not request.echo else None

    @property
    def stop_ids(self) -> frozenset[int]:
        """The token ids that end the generation (end-of-text)."""
        return frozenset(self._eos)

    def opening(self) -> bytes | None:
        """The role chunk that opens a chat stream (an echo opens with :meth:`echo` instead)."""
        return None if self.request.echo else self._event(ChunkFrame(role="assistant"))

    def token(self, choice: Choice) -> bytes | None:
        """The frame for one produced token: a text chunk, a ``: step`` comment, or None.

        None when the token ends the generation without text of its own (its
        id goes out with :meth:`closing`).
        """
        token = choice.token_id
        self.produced += 1
        self._unsent.append(token)
        if self.request.logprobs:
            assert choice.score is not None
            self._entries.append(self._entry(token, choice.score))
        if token in self._eos:
            self.finish = "stop"
            return None
        text = self._stopper.feed(self._detokenizer.push(token))
        if self._stopper.stopped:
            self.finish = "stop"
        elif self.produced >= self.budget:
            self.finish = "length"
        if text:
            frame = ChunkFrame(
                content=text, token_ids=tuple(self._unsent), logprobs=tuple(self._entries)
            )
            self._unsent, self._entries = [], []
            return self._event(frame)
        return SSE_STEP_COMMENT if self.finish is None else None

    def echo(self, choice: Choice) -> bytes:
        """The first event of an echo: the role, the prompt's ids and their logprob entries.

        Up to ``ECHO_MAX_SCORES`` values to write: run it on a worker thread.
        """
        prompt = self.prompt
        token, raw = token_pieces(self.service.shard.tokenizer)(prompt[0])
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

    def closing(self) -> list[bytes]:
        """The last chunk (the text held back, finish reason, usage) and ``[DONE]``."""
        stopper = self._stopper
        tail = "" if stopper.stopped else stopper.feed(self._detokenizer.flush()) + stopper.flush()
        usage = Usage(
            prompt_tokens=len(self.prompt),
            completion_tokens=len(self.request.resume_token_ids) + self.produced,
            cached_tokens=min(self.cached_tokens, len(self.prompt)),
            drafted_tokens=self.drafted,
            accepted_tokens=self.accepted,
        )
        last = ChunkFrame(
            content=tail,
            token_ids=tuple(self._unsent),
            finish_reason=self.finish,
            usage=usage,
            logprobs=tuple(self._entries),
        )
        return [self._event(last), sse_event(SSE_DONE)]

    def failed(self, node_id: str, message: str, code: str) -> list[bytes]:
        """The error frame that ends a stream whose route failed, and ``[DONE]``."""
        error = ErrorFrame(message=f"hop {node_id} failed: {message}", code=code, node_id=node_id)
        return [sse_event(error.to_json()), sse_event(SSE_DONE)]

    def _event(self, frame: ChunkFrame) -> bytes:
        return frame.event(
            completion_id=self.completion_id, created=self.created, model=self.request.model
        )

    def _entry(self, token_id: int, score: TokenScore) -> TokenLogprob:
        """A token's logprob entry, written as ``protocol.logprobs.TokenLogprob`` says."""
        pieces = token_pieces(self.service.shard.tokenizer)
        token, raw = pieces(token_id)
        top = []
        for alternative, logprob in score.top:
            written, alternative_raw = pieces(alternative)
            top.append(TopLogprob(written, logprob, tuple(alternative_raw)))
        return TokenLogprob(token, score.logprob, tuple(raw), tuple(top))
