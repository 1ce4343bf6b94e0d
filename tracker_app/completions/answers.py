"""What an endpoint's answer is made of, whichever endpoint: the :class:`Answer` protocol.

The proxy (:mod:`tracker_app.completions.proxy`) runs the choices of a request and hands
what they produce (:class:`~tracker_app.completions.generation.Piece`) to the answer of
the endpoint that took the request: chat chunks
(:class:`~tracker_app.completions.chat_answer.ChatAnswer`) or legacy
``text_completion`` ones (:class:`~tracker_app.completions.text_answer.TextCompletionAnswer`),
each built through its declaration in :mod:`~tracker_app.completions.shapes`.
The Anthropic Messages API (:class:`~tracker_app.completions.messages_answer.MessagesAnswer`)
and OpenAI's Responses API (:class:`~tracker_app.completions.responses_answer.ResponsesAnswer`)
are answers of the same kind over the same pipeline (ADR-0024). The answer shapes bytes and
JSON; it decides nothing about routes, billing or failures.

:class:`HeldCalls` is how every answer of a request with tools holds a choice's
text back once it opens as calls do, and reads the calls from it at the end.

:class:`TextEvents` writes a text chunk's server-sent event with the request's
fixed fields encoded once, not once per token: per token only the JSON of the
text is encoded (ADR-0004).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from meshnet_site.errors import DomainError, http_error
from nodes_app.protocol.sse import sse_event
from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.shapes import CompletionUsage, MeshnetRoute
from tracker_app.completions.tools import AnswerCalls, ToolUse, calls_of


class Answer(Protocol):
    """One request's answer in its endpoint's shape."""

    def opening(self, meshnet: MeshnetRoute, prompt_tokens: int | None = None) -> list[bytes]:
        """The events before any text: the first carries ``meshnet``, the route;
        ``prompt_tokens``: the prompt's billed tokens when already known."""
        ...

    def piece(self, piece: Piece) -> bytes:
        """The event of a piece of one choice's text (empty: nothing to send yet)."""
        ...

    def finish(
        self,
        choice: int,
        finish_reason: str,
        usage: CompletionUsage | None,
        stop: str | None = None,
        meshnet: MeshnetRoute | None = None,
    ) -> bytes:
        """The event that ends ``choice``; the request's last one carries ``usage`` and
        ``meshnet``, a whole reply's (with ``speculation``). ``stop``: the stop sequence
        that ended it, if one did."""
        ...

    def reply(
        self, generations: Sequence[Generation], usage: CompletionUsage, meshnet: MeshnetRoute
    ) -> Mapping[str, object]:
        """The whole answer (``stream: false``), its choices in order."""
        ...

    def failed(self, error: DomainError) -> bytes:
        """The event that ends a stream the network failed (nothing follows it)."""
        ...


class AnswerKind(Protocol):
    """An endpoint's answer shape: the API it answers (recorded with the request), its id
    prefix, and an answer per request."""

    api: str
    id_prefix: str

    def __call__(self, *, completion_id: str, created: int, params: GenerationParams) -> Answer: ...


# Stands for the text in the one encoding of a request's text chunk (NULs: no
# model name or id the tracker accepts holds them, and they are escaped in JSON).
_TEXT_MARK = "\x00meshnet-text\x00"


@dataclass(frozen=True)
class TextEvents:
    """The server-sent events of one choice's text chunks, byte for byte
    ``sse_event(chunk(text))``.

    Everything but the text (id, created, model, the choice's frame) is
    encoded once per request and choice; each token costs the JSON of its text only.
    """

    before: bytes
    after: bytes

    @classmethod
    def around(
        cls,
        chunk: Callable[[str], Mapping[str, Any]],
        *,
        event: Callable[[Mapping[str, Any]], bytes] = sse_event,
    ) -> TextEvents:
        """The events of ``chunk(text)``, a chunk whose only varying string is ``text``,
        written by ``event``."""
        written = event(chunk(_TEXT_MARK))
        before, _, after = written.rpartition(json.dumps(_TEXT_MARK).encode())
        return cls(before=before, after=after)

    def event(self, text: str) -> bytes:
        return self.before + json.dumps(text).encode() + self.after


def openai_failed(error: DomainError) -> bytes:
    """The event ending an OpenAI-style stream the network failed: ``{"error": …}``."""
    return sse_event(http_error(error).body)


def sse_named(event: str, payload: Mapping[str, Any]) -> bytes:
    """One server-sent event with its ``event:`` name, as the Anthropic and Responses
    streams name theirs."""
    return f"event: {event}\n".encode() + sse_event(payload)


class HeldCalls:
    """Which choices of a request with tools hold their text back as calls.

    A choice's text is held from its first character when it opens as calls do
    (always, unless ``tool_choice`` is ``"auto"``, where text never does): its
    calls are only known valid once the grammar is done, or the answer cut.
    """

    def __init__(self, use: ToolUse | None, choices: int) -> None:
        self.use = use
        # The choices not yet known to be text or calls, and the text held of calls.
        self._undecided = set(range(choices)) if use is not None else set()
        self._held: dict[int, list[str]] = {}

    def holds(self, choice: int, text: str) -> bool:
        """Whether ``text`` of ``choice`` is held back as part of its calls."""
        if choice in self._held:
            self._held[choice].append(text)
            return True
        if choice not in self._undecided or not text:
            return False
        self._undecided.discard(choice)
        assert self.use is not None
        if self.use.mode == "auto" and not text.startswith(self.use.calls_open):
            return False
        self._held[choice] = [text]
        return True

    def release(self, choice: int) -> AnswerCalls | None:
        """The calls of ``choice``'s held text (those complete, if it was cut); None when
        it held nothing back (its text was sent)."""
        held = self._held.pop(choice, None)
        if held is None:
            return None
        assert self.use is not None
        made = calls_of("".join(held), self.use)
        assert made is not None  # held: it opened as calls do
        return made

    def of(self, text: str) -> AnswerCalls | None:
        """The calls of a whole answer's ``text``; None when it is text."""
        return None if self.use is None else calls_of(text, self.use)
