"""The chat endpoint's answer: ``chat.completion.chunk`` events, or one ``chat.completion``.

:class:`ChatAnswer` builds each through its declaration in
:mod:`~tracker_app.completions.shapes` (the schema documents the same ones),
each choice's chunks indexed by choice, the first opening with its role.

A request with tools the model may call (:mod:`~tracker_app.completions.tools`)
holds back a choice's text from its first character on when that opens calls
(:class:`~tracker_app.completions.answers.HeldCalls`: always, unless
``tool_choice`` is ``"auto"``, where text never starts as calls do), and
ends the choice with its ``tool_calls`` as OpenAI streams them (per call a
delta naming it, then one with its arguments) and ``finish_reason:
"tool_calls"``. Calls cut short by ``max_tokens`` (or a stop sequence) end
with the calls completed before the cut and the finish reason that says so
(``"length"``); the unfinished call is never given as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, cast

from meshnet_site.errors import DomainError
from nodes_app.protocol.logprobs import TokenLogprob
from nodes_app.protocol.sse import sse_event
from tracker_app.completions.answers import HeldCalls, TextEvents, openai_failed
from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.shapes import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatFinishReason,
    ChatTokenLogprob,
    ChatTopLogprob,
    ChoiceLogprobs,
    CompletionUsage,
    FinishReason,
    FunctionDelta,
    MeshnetRoute,
    ToolCall,
    ToolCallDelta,
)


def choice_chunk(
    *,
    completion_id: str,
    created: int,
    model: str,
    choice: int,
    delta: ChatDelta,
    finish_reason: ChatFinishReason | None = None,
    logprobs: ChoiceLogprobs | None = None,
    meshnet: MeshnetRoute | None = None,
    usage: CompletionUsage | None = None,
) -> ChatCompletionChunk:
    """A ``chat.completion.chunk`` of choice ``choice``; ``logprobs``, ``meshnet`` and
    ``usage`` only where given."""
    # Literals typed by their declarations: mypy checks them, and they cost what a dict does.
    choice_of: ChatChunkChoice = {"index": choice, "delta": delta, "finish_reason": finish_reason}
    if logprobs is not None:
        choice_of["logprobs"] = logprobs
    chunk: ChatCompletionChunk = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice_of],
    }
    if meshnet is not None:
        chunk["meshnet"] = meshnet
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def token_logprob(entry: TokenLogprob) -> ChatTokenLogprob:
    """One token's entry of a choice's ``logprobs.content``, its alternatives best first."""
    tops: list[ChatTopLogprob] = [
        {"token": top.token, "logprob": top.logprob, "bytes": list(top.utf8)}
        for top in entry.top_logprobs
    ]
    # Only an echoed prompt's first token has no logprob, and a chat echoes nothing.
    logprob = cast(float, entry.logprob)
    return {
        "token": entry.token,
        "logprob": logprob,
        "bytes": list(entry.utf8),
        "top_logprobs": tops,
    }


def _call_deltas(index: int, call: ToolCall) -> tuple[ToolCallDelta, ToolCallDelta]:
    """A tool call's two deltas, as OpenAI streams one: its name, then its arguments."""
    named = ToolCallDelta(
        index=index,
        id=call["id"],
        type="function",
        function=FunctionDelta(name=call["function"]["name"], arguments=""),
    )
    arguments = ToolCallDelta(
        index=index, function=FunctionDelta(arguments=call["function"]["arguments"])
    )
    return named, arguments


class ChatAnswer:
    """The chat endpoint's answer: ``chat.completion.chunk`` events, each choice opening
    with its role, or one ``chat.completion``."""

    api = "chat.completions"
    id_prefix = "chatcmpl-"

    def __init__(self, *, completion_id: str, created: int, params: GenerationParams) -> None:
        self.completion_id, self.created, self.model = completion_id, created, params.model
        self.choices = params.choices
        self.logprobs = params.logprobs
        self._text = [
            TextEvents.around(partial(self._text_chunk, choice)) for choice in range(self.choices)
        ]
        self._calls = HeldCalls(params.tool_use, self.choices)

    def _text_chunk(self, choice: int, text: str) -> ChatCompletionChunk:
        return self._chunk(choice, delta=ChatDelta(content=text))

    def _chunk(self, choice: int, **fields: Any) -> ChatCompletionChunk:
        return choice_chunk(
            completion_id=self.completion_id,
            created=self.created,
            model=self.model,
            choice=choice,
            **fields,
        )

    def opening(self, meshnet: MeshnetRoute, prompt_tokens: int | None = None) -> list[bytes]:
        return [
            sse_event(
                self._chunk(
                    choice,
                    delta=ChatDelta(role="assistant", content=""),
                    meshnet=meshnet if choice == 0 else None,
                )
            )
            for choice in range(self.choices)
        ]

    def piece(self, piece: Piece) -> bytes:
        if self._calls.holds(piece.choice, piece.text):
            return b""
        if not piece.logprobs:
            return self._text[piece.choice].event(piece.text)
        content: ChoiceLogprobs = {"content": [token_logprob(entry) for entry in piece.logprobs]}
        return sse_event(self._chunk(piece.choice, delta={"content": piece.text}, logprobs=content))

    def finish(
        self,
        choice: int,
        finish_reason: str,
        usage: CompletionUsage | None,
        stop: str | None = None,
        meshnet: MeshnetRoute | None = None,
    ) -> bytes:
        made = self._calls.release(choice)
        before = b""
        if made is not None:
            before = b"".join(
                sse_event(self._chunk(choice, delta=ChatDelta(tool_calls=[delta])))
                for index, call in enumerate(made.calls)
                for delta in _call_deltas(index, call)
            )
            if made.whole:
                finish_reason = "tool_calls"
        return before + sse_event(
            self._chunk(
                choice,
                delta=ChatDelta(),
                finish_reason=cast(ChatFinishReason, finish_reason),
                meshnet=meshnet,
                usage=usage,
            )
        )

    def failed(self, error: DomainError) -> bytes:
        return openai_failed(error)

    def _message(self, generation: Generation) -> tuple[AssistantMessage, ChatFinishReason]:
        """A whole choice's message and finish reason: its text, or its tool calls (those
        completed before a cut, with the reason that cut it)."""
        reason = cast(FinishReason, generation.finish_reason)
        made = self._calls.of(generation.content)
        if made is None:
            return AssistantMessage(role="assistant", content=generation.content), reason
        message = AssistantMessage(role="assistant", content=None)
        if made.calls:
            message["tool_calls"] = list(made.calls)
        return message, "tool_calls" if made.whole else reason

    def _choice(self, generation: Generation) -> ChatChoice:
        message, finish_reason = self._message(generation)
        return ChatChoice(
            index=generation.choice,
            message=message,
            logprobs=(
                ChoiceLogprobs(content=[token_logprob(entry) for entry in generation.logprobs])
                if self.logprobs
                else None
            ),
            finish_reason=finish_reason,
        )

    def reply(
        self, generations: Sequence[Generation], usage: CompletionUsage, meshnet: MeshnetRoute
    ) -> ChatCompletion:
        return ChatCompletion(
            id=self.completion_id,
            object="chat.completion",
            created=self.created,
            model=self.model,
            choices=[self._choice(generation) for generation in generations],
            usage=usage,
            meshnet=meshnet,
        )
