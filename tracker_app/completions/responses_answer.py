"""The OpenAI Responses answer: one ``response``, or its typed event stream.

An adapter over the same pipeline (ADR-0024): the proxy hands it the pieces of
the request's one choice. The response's ``output`` is a ``message`` item
(one ``output_text`` part) or, when the answer calls the request's tools, a
``function_call`` item per call. Streamed, the events are the ones the
official client reads, each named by its ``event:`` line and numbered by
``sequence_number``::

    response.created, response.in_progress        (the response, empty)
    response.output_item.added, response.content_part.added
    response.output_text.delta ...                 (text as it comes)
    response.output_text.done, response.content_part.done, response.output_item.done
    response.output_item.added / response.function_call_arguments.delta / .done /
        response.output_item.done                  (per call, at the end)
    response.completed  or  response.incomplete    (the whole response)

An answer cut by ``max_output_tokens`` is ``status: "incomplete"`` with
``incomplete_details.reason: "max_output_tokens"``; its calls completed before
the cut are its ``function_call`` items. Nothing is stored: ``store: false``.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, Literal, NotRequired, TypedDict

from meshnet_site.errors import DomainError, http_error
from tracker_app.completions.answers import HeldCalls, sse_named
from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.shapes import CompletionUsage, MeshnetRoute, ToolCall
from tracker_app.completions.tools import AnswerCalls

Status = Literal["in_progress", "completed", "incomplete"]


class OutputText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class MessageItem(TypedDict):
    type: Literal["message"]
    id: str
    status: Status
    role: Literal["assistant"]
    content: list[OutputText]


class FunctionCallItem(TypedDict):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: Status


class ResponseUsage(TypedDict):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class Response(TypedDict):
    """OpenAI's ``response``, with what it repeats of the request; ``meshnet`` the route."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Status
    incomplete_details: dict[str, str] | None
    error: None
    model: str
    output: list[MessageItem | FunctionCallItem]
    usage: ResponseUsage | None
    store: Literal[False]
    previous_response_id: None
    instructions: Any
    max_output_tokens: Any
    temperature: Any
    top_p: Any
    tools: Any
    tool_choice: Any
    parallel_tool_calls: Any
    text: Any
    metadata: Any
    meshnet: NotRequired[MeshnetRoute]


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def function_call_item(call: ToolCall, status: Status = "completed") -> FunctionCallItem:
    """A call read from the answer as a ``function_call`` output item."""
    return FunctionCallItem(
        type="function_call",
        id=_item_id("fc"),
        call_id=call["id"],
        name=call["function"]["name"],
        arguments=call["function"]["arguments"],
        status=status,
    )


def _status(finish_reason: str, made: AnswerCalls | None) -> Status:
    if made is not None and made.whole:
        return "completed"
    return "incomplete" if finish_reason == "length" else "completed"


def _usage(usage: CompletionUsage) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=usage["prompt_tokens"],
        input_tokens_details={
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        output_tokens=usage["completion_tokens"],
        output_tokens_details={"reasoning_tokens": 0},
        total_tokens=usage["total_tokens"],
    )


class ResponsesAnswer:
    """``POST /v1/responses``'s answer (one choice: the Responses API has no ``n``)."""

    api = "responses"
    id_prefix = "resp_"

    def __init__(self, *, completion_id: str, created: int, params: GenerationParams) -> None:
        self.response_id, self.created, self.model = completion_id, created, params.model
        self.echoed = dict(params.echoed)
        self._calls = HeldCalls(params.tool_use, 1)
        self._sequence = 0
        self._meshnet: MeshnetRoute | None = None
        self._message_id = _item_id("msg")
        self._text: list[str] | None = None  # the message's text, once it opened
        self._items = 0  # output items opened so far

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse_named(kind, payload)

    def _response(
        self,
        status: Status,
        output: list[MessageItem | FunctionCallItem],
        usage: CompletionUsage | None,
        meshnet: MeshnetRoute | None,
    ) -> Response:
        response = Response(
            id=self.response_id,
            object="response",
            created_at=self.created,
            status=status,
            incomplete_details=(
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            error=None,
            model=self.model,
            output=output,
            usage=_usage(usage) if usage is not None else None,
            store=False,
            previous_response_id=None,
            **self.echoed,  # type: ignore[typeddict-item]  # the request's own fields
        )
        if meshnet is not None:
            response["meshnet"] = meshnet
        return response

    def _message(self, text: str, status: Status) -> MessageItem:
        part = OutputText(type="output_text", text=text, annotations=[], logprobs=[])
        return MessageItem(
            type="message", id=self._message_id, status=status, role="assistant", content=[part]
        )

    def opening(self, meshnet: MeshnetRoute, prompt_tokens: int | None = None) -> list[bytes]:
        self._meshnet = meshnet
        response = self._response("in_progress", [], None, meshnet)
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def piece(self, piece: Piece) -> bytes:
        if not piece.text or self._calls.holds(piece.choice, piece.text):
            return b""
        before = b""
        if self._text is None:
            self._text, self._items = [], 1
            item = dict(self._message("", "in_progress"), content=[])
            before = self._event("response.output_item.added", output_index=0, item=item) + (
                self._event(
                    "response.content_part.added",
                    item_id=self._message_id,
                    output_index=0,
                    content_index=0,
                    part=OutputText(type="output_text", text="", annotations=[], logprobs=[]),
                )
            )
        self._text.append(piece.text)
        return before + self._event(
            "response.output_text.delta",
            item_id=self._message_id,
            output_index=0,
            content_index=0,
            delta=piece.text,
            logprobs=[],
        )

    def finish(
        self,
        choice: int,
        finish_reason: str,
        usage: CompletionUsage | None,
        stop: str | None = None,
        meshnet: MeshnetRoute | None = None,
    ) -> bytes:
        made = self._calls.release(choice)
        status = _status(finish_reason, made)
        output: list[MessageItem | FunctionCallItem] = []
        events = []
        if self._text is not None:
            message = self._message("".join(self._text), status)
            part = message["content"][0]
            common: dict[str, Any] = {"item_id": self._message_id, "output_index": 0}
            events += [
                self._event(
                    "response.output_text.done",
                    **common,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                ),
                self._event("response.content_part.done", **common, content_index=0, part=part),
                self._event("response.output_item.done", output_index=0, item=message),
            ]
            output.append(message)
        for call in made.calls if made is not None else ():
            index, self._items = self._items, self._items + 1
            item = function_call_item(call)
            events += [
                self._event(
                    "response.output_item.added",
                    output_index=index,
                    item=dict(item, arguments="", status="in_progress"),
                ),
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=item["arguments"],
                ),
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                ),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
            output.append(item)
        response = self._response(status, output, usage, meshnet or self._meshnet)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        events.append(self._event(kind, response=response))
        return b"".join(events)

    def reply(
        self, generations: Sequence[Generation], usage: CompletionUsage, meshnet: MeshnetRoute
    ) -> Response:
        [generation] = generations
        text = generation.content
        made = self._calls.of(text)
        status = _status(generation.finish_reason, made)
        output: list[MessageItem | FunctionCallItem]
        if made is None:
            output = [self._message(text, status)] if text else []
        else:
            output = [function_call_item(call) for call in made.calls]
        return self._response(status, output, usage, meshnet)

    def failed(self, error: DomainError) -> bytes:
        body = http_error(error).body["error"]
        return self._event(
            "error", code=body["code"], message=body["message"], param=body.get("param")
        )
