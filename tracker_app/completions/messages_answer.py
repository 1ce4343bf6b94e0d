"""The Anthropic Messages answer: one ``message``, or Anthropic's event stream.

An adapter over the same pipeline (ADR-0024): the proxy hands it the pieces
of the request's one choice as it does the chat answer's. Streamed, the
events are Anthropic's, each named by its ``event:`` line::

    message_start  (the message, empty, with ``meshnet``: the route)
    content_block_start / content_block_delta (text_delta) / content_block_stop
    content_block_start (tool_use) / content_block_delta (input_json_delta) / ..._stop
    message_delta  (stop_reason, stop_sequence, usage; ``meshnet`` with ``speculation``)
    message_stop

Text streams as it comes. Calls are held back (:class:`~tracker_app.completions.answers.HeldCalls`)
and come at the end, a ``tool_use`` block each, its input in one
``input_json_delta``. ``stop_reason``: ``end_turn``, ``stop_sequence`` (the
generation ended by one of ``stop_sequences``), ``max_tokens``, ``tool_use``;
calls cut by ``max_tokens`` come as the ``tool_use`` blocks completed before
the cut, with ``max_tokens``. Errors are Anthropic's ``error`` event and shape.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal, NotRequired, TypedDict

from meshnet_site.errors import DomainError, anthropic_error_body
from tracker_app.completions.answers import HeldCalls, TextEvents, sse_named
from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.shapes import CompletionUsage, MeshnetRoute, ToolCall
from tracker_app.completions.tools import AnswerCalls

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextBlock(TypedDict):
    type: Literal["text"]
    text: str


class ToolUseBlock(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(TypedDict):
    input_tokens: int
    output_tokens: int
    # Of the input tokens, those the route took from its prefix caches (ADR-0027).
    cache_read_input_tokens: NotRequired[int]


class Message(TypedDict):
    """Anthropic's ``message``: content blocks, why it stopped, usage; ``meshnet`` the route."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[TextBlock | ToolUseBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage
    meshnet: NotRequired[MeshnetRoute]


def tool_use_block(call: ToolCall) -> ToolUseBlock:
    """A call read from the answer as Anthropic's ``tool_use`` block (its id ``toolu_…``)."""
    return ToolUseBlock(
        type="tool_use",
        id="toolu_" + call["id"].removeprefix("call_"),
        name=call["function"]["name"],
        input=json.loads(call["function"]["arguments"]),
    )


def stop_reason(finish_reason: str, made: AnswerCalls | None, stop: str | None) -> StopReason:
    """Anthropic's ``stop_reason`` for how the choice ended."""
    if made is not None and made.whole:
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop is not None else "end_turn"


def _usage(usage: CompletionUsage) -> MessageUsage:
    return MessageUsage(
        input_tokens=usage["prompt_tokens"],
        output_tokens=usage["completion_tokens"],
        cache_read_input_tokens=usage["prompt_tokens_details"]["cached_tokens"],
    )


class MessagesAnswer:
    """``POST /v1/messages``'s answer (one choice: Anthropic has no ``n``)."""

    api = "messages"
    id_prefix = "msg_"

    def __init__(self, *, completion_id: str, created: int, params: GenerationParams) -> None:
        self.message_id, self.model = completion_id, params.model
        self._calls = HeldCalls(params.tool_use, 1)
        self._blocks = 0  # content blocks opened so far
        # The open text block's delta events (None: no text block open).
        self._text: TextEvents | None = None

    def _named(self, payload: Any) -> bytes:
        return sse_named(payload["type"], payload)

    def _text_delta(self, text: str) -> dict[str, Any]:
        return {
            "type": "content_block_delta",
            "index": self._blocks - 1,
            "delta": {"type": "text_delta", "text": text},
        }

    def _message(
        self,
        content: list[TextBlock | ToolUseBlock],
        reason: StopReason | None,
        stop: str | None,
        usage: MessageUsage,
        meshnet: MeshnetRoute,
    ) -> Message:
        return Message(
            id=self.message_id,
            type="message",
            role="assistant",
            model=self.model,
            content=content,
            stop_reason=reason,
            stop_sequence=stop,
            usage=usage,
            meshnet=meshnet,
        )

    def opening(self, meshnet: MeshnetRoute, prompt_tokens: int | None = None) -> list[bytes]:
        # Anthropic counts the input in message_start; message_delta says it again.
        usage = MessageUsage(input_tokens=prompt_tokens or 0, output_tokens=0)
        start = self._message([], None, None, usage, meshnet)
        return [self._named({"type": "message_start", "message": start})]

    def piece(self, piece: Piece) -> bytes:
        if not piece.text or self._calls.holds(piece.choice, piece.text):
            return b""
        before = b""
        if self._text is None:
            self._blocks += 1
            self._text = TextEvents.around(self._text_delta, event=self._named)
            before = self._named(
                {
                    "type": "content_block_start",
                    "index": self._blocks - 1,
                    "content_block": {"type": "text", "text": ""},
                }
            )
        return before + self._text.event(piece.text)

    def finish(
        self,
        choice: int,
        finish_reason: str,
        usage: CompletionUsage | None,
        stop: str | None = None,
        meshnet: MeshnetRoute | None = None,
    ) -> bytes:
        events = []
        if self._text is not None:
            events.append(self._named({"type": "content_block_stop", "index": self._blocks - 1}))
            self._text = None
        made = self._calls.release(choice)
        for call in made.calls if made is not None else ():
            index, self._blocks = self._blocks, self._blocks + 1
            block = tool_use_block(call)
            arguments = call["function"]["arguments"]
            events += [
                self._named(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {**block, "input": {}},
                    }
                ),
                self._named(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": arguments},
                    }
                ),
                self._named({"type": "content_block_stop", "index": index}),
            ]
        reason = stop_reason(finish_reason, made, stop)
        delta = {
            "stop_reason": reason,
            "stop_sequence": stop if reason == "stop_sequence" else None,
        }
        counted = (
            _usage(usage) if usage is not None else MessageUsage(input_tokens=0, output_tokens=0)
        )
        message_delta: dict[str, Any] = {"type": "message_delta", "delta": delta, "usage": counted}
        if meshnet is not None:
            message_delta["meshnet"] = meshnet
        events += [
            self._named(message_delta),
            self._named({"type": "message_stop"}),
        ]
        return b"".join(events)

    def reply(
        self, generations: Sequence[Generation], usage: CompletionUsage, meshnet: MeshnetRoute
    ) -> Message:
        [generation] = generations
        text = generation.content
        made = self._calls.of(text)
        content: list[TextBlock | ToolUseBlock]
        if made is None:
            content = [TextBlock(type="text", text=text)] if text else []
        else:
            content = [tool_use_block(call) for call in made.calls]
        stop = generation.stop_sequence
        reason = stop_reason(generation.finish_reason, made, stop)
        return self._message(
            content, reason, stop if reason == "stop_sequence" else None, _usage(usage), meshnet
        )

    def failed(self, error: DomainError) -> bytes:
        return sse_named("error", anthropic_error_body(error))
