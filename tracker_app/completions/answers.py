"""What an endpoint's answer is made of, whichever endpoint: the :class:`Answer` protocol.

The proxy (:mod:`tracker_app.completions.proxy`) runs the choices of a request and hands
what they produce (:class:`~tracker_app.completions.generation.Piece`) to the answer of
the endpoint that took the request: chat chunks
(:class:`~tracker_app.completions.chat_answer.ChatAnswer`) or legacy
``text_completion`` ones (:class:`~tracker_app.completions.text_answer.TextCompletionAnswer`),
each built through its declaration in :mod:`~tracker_app.completions.shapes`.
The answer shapes bytes and JSON; it decides nothing about routes, billing or failures.

:class:`TextEvents` writes a text chunk's server-sent event with the request's
fixed fields encoded once, not once per token: per token only the JSON of the
text is encoded (ADR-0004).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nodes_app.protocol.sse import sse_event
from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.shapes import MeshnetRoute, Usage


class Answer(Protocol):
    """One request's answer in its endpoint's shape."""

    def opening(self, meshnet: MeshnetRoute) -> list[bytes]:
        """The events before any text: the first carries ``meshnet``, the route."""
        ...

    def piece(self, piece: Piece) -> bytes:
        """The event of a piece of one choice's text (empty: nothing to send yet)."""
        ...

    def finish(self, choice: int, finish_reason: str, usage: Usage | None) -> bytes:
        """The event that ends ``choice``; the request's last one carries ``usage``."""
        ...

    def reply(
        self, generations: Sequence[Generation], usage: Usage, meshnet: MeshnetRoute
    ) -> Mapping[str, object]:
        """The whole answer (``stream: false``), its choices in order."""
        ...


class AnswerKind(Protocol):
    """An endpoint's answer shape: its id prefix, and an answer per request."""

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
    def around(cls, chunk: Callable[[str], Mapping[str, Any]]) -> TextEvents:
        """The events of ``chunk(text)``, a chunk whose only varying string is ``text``."""
        event = sse_event(chunk(_TEXT_MARK))
        before, _, after = event.rpartition(json.dumps(_TEXT_MARK).encode())
        return cls(before=before, after=after)

    def event(self, text: str) -> bytes:
        return self.before + json.dumps(text).encode() + self.after
