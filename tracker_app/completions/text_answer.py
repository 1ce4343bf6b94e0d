"""The legacy endpoint's answer: ``text_completion`` chunks, or one ``text_completion``.

:class:`TextCompletionAnswer` builds each through its declaration in
:mod:`~tracker_app.completions.shapes` (the schema documents the same ones),
with OpenAI's legacy ``logprobs`` (:func:`legacy_logprobs`): tokens spelled
as the legacy API spells them, their best alternatives, and where each
starts in the choice's text (:class:`TextOffsets`).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import cast

from meshnet_site.errors import DomainError
from nodes_app.protocol.logprobs import TokenLogprob
from nodes_app.protocol.sse import sse_event
from tracker_app.completions.answers import TextEvents, openai_failed
from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.parameters import GenerationParams, Prompt
from tracker_app.completions.shapes import (
    CompletionUsage,
    FinishReason,
    LegacyLogprobs,
    MeshnetRoute,
    TextChoice,
    TextChunkChoice,
    TextCompletion,
    TextCompletionChunk,
)


@dataclass
class TextOffsets:
    """Where each token starts in a choice's text, in characters (legacy ``text_offset``).

    A token's bytes may hold part of a character (a byte-level BPE piece): a
    token starts after the characters its predecessors completed. A special
    token has no bytes (``protocol.logprobs.TokenLogprob``): in an echoed prompt it
    stands for its written form when ``prompt``, the echoed text, holds that
    form there (the client wrote it); one the tokenizer added (a BOS) is not
    in the text and takes no characters, nor does one in a completion.
    """

    prompt: str = ""
    characters: int = 0
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    def advance(self, entry: TokenLogprob, *, echoed: bool) -> int:
        """The offset of ``entry``, the next token; moves past it."""
        start = self.characters
        raw = bytes(entry.utf8)
        if not raw and echoed and self.prompt.startswith(entry.token, self.characters):
            raw = entry.token.encode()
        self.characters += len(self._decoder.decode(raw))
        return start


def legacy_token(token: str, utf8: Sequence[int]) -> str:
    """A token as the legacy answer spells it: its text, or OpenAI's ``bytes:\\xNN…`` when
    its bytes are only part of a character (decoded they would all read U+FFFD, and
    alternatives, keyed by spelling, would collide). A special token (no bytes) keeps
    its written form."""
    try:
        return bytes(utf8).decode() if utf8 else token
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in utf8)


def legacy_logprobs(
    entries: Iterable[TokenLogprob], *, top: int, offsets: TextOffsets, echoed: bool = False
) -> LegacyLogprobs:
    """OpenAI's legacy ``logprobs`` of ``entries``: ``tokens``, ``token_logprobs``,
    ``top_logprobs`` (each token's ``top`` best alternatives, the token itself among
    them: up to ``top + 1``) and ``text_offset``. An echoed prompt's first token has
    no logprob: null, as OpenAI gives it. Tokens are spelled by :func:`legacy_token`;
    two alternatives spelled alike keep the better logprob (the first)."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    for entry in entries:
        token = legacy_token(entry.token, entry.utf8)
        tokens.append(token)
        token_logprobs.append(entry.logprob)
        text_offset.append(offsets.advance(entry, echoed=echoed))
        if entry.logprob is None:
            top_logprobs.append(None)
            continue
        best: dict[str, float] = {}
        for alternative in entry.top_logprobs[:top]:  # best first
            best.setdefault(legacy_token(alternative.token, alternative.utf8), alternative.logprob)
        best.setdefault(token, entry.logprob)
        top_logprobs.append(best)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


class TextCompletionAnswer:
    """The legacy endpoint's answer: ``text_completion`` chunks (the first carries the
    route, each choice ends with its ``finish_reason``), or one ``text_completion``."""

    api = "completions"
    id_prefix = "cmpl-"

    def __init__(self, *, completion_id: str, created: int, params: GenerationParams) -> None:
        self.completion_id, self.created, self.model = completion_id, created, params.model
        self.echo = params.echo
        self.logprobs = params.logprobs
        self.top = params.top_logprobs
        # Each streamed choice's text so far, for its tokens' offsets.
        self._offsets = [
            TextOffsets(prompt=_text_of(params.prompt_of(choice)))
            for choice in range(params.choices)
        ]
        self._text = [
            TextEvents.around(partial(self._text_chunk, choice)) for choice in range(params.choices)
        ]

    def _chunk(
        self,
        choice: int,
        text: str,
        finish_reason: FinishReason | None = None,
        logprobs: LegacyLogprobs | None = None,
        meshnet: MeshnetRoute | None = None,
        usage: CompletionUsage | None = None,
    ) -> TextCompletionChunk:
        # Literals typed by their declarations: mypy checks them, and they cost what a
        # dict does (a streamed token's chunk is built here).
        choice_of: TextChunkChoice = {
            "text": text,
            "index": choice,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        chunk: TextCompletionChunk = {
            "id": self.completion_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice_of],
        }
        if meshnet is not None:
            chunk["meshnet"] = meshnet
        if usage is not None:
            chunk["usage"] = usage
        return chunk

    def _text_chunk(self, choice: int, text: str) -> TextCompletionChunk:
        return self._chunk(choice, text)

    def opening(self, meshnet: MeshnetRoute, prompt_tokens: int | None = None) -> list[bytes]:
        return [sse_event(self._chunk(0, "", meshnet=meshnet))]

    def piece(self, piece: Piece) -> bytes:
        if not self.logprobs:
            return self._text[piece.choice].event(piece.text)
        logprobs = legacy_logprobs(
            piece.logprobs, top=self.top, offsets=self._offsets[piece.choice], echoed=piece.echo
        )
        return sse_event(self._chunk(piece.choice, piece.text, logprobs=logprobs))

    def finish(
        self,
        choice: int,
        finish_reason: str,
        usage: CompletionUsage | None,
        stop: str | None = None,
        meshnet: MeshnetRoute | None = None,
    ) -> bytes:
        reason = cast(FinishReason, finish_reason)
        return sse_event(self._chunk(choice, "", reason, meshnet=meshnet, usage=usage))

    def failed(self, error: DomainError) -> bytes:
        return openai_failed(error)

    def reply(
        self, generations: Sequence[Generation], usage: CompletionUsage, meshnet: MeshnetRoute
    ) -> TextCompletion:
        return TextCompletion(
            id=self.completion_id,
            object="text_completion",
            created=self.created,
            model=self.model,
            choices=[
                TextChoice(
                    text=self._echoed(generation) + generation.content,
                    index=generation.choice,
                    logprobs=self._logprobs(generation),
                    finish_reason=cast(FinishReason, generation.finish_reason),
                )
                for generation in generations
            ],
            usage=usage,
            meshnet=meshnet,
        )

    def _echoed(self, generation: Generation) -> str:
        return _text_of(generation.prompt) if self.echo else ""

    def _logprobs(self, generation: Generation) -> LegacyLogprobs | None:
        """A whole choice's legacy logprobs: the echoed prompt's tokens, then its own."""
        if not self.logprobs:
            return None
        offsets = TextOffsets(prompt=_text_of(generation.prompt))
        prompt = legacy_logprobs(
            generation.prompt_logprobs if self.echo else (),
            top=self.top,
            offsets=offsets,
            echoed=True,
        )
        completion = legacy_logprobs(generation.logprobs, top=self.top, offsets=offsets)
        return LegacyLogprobs(
            tokens=prompt["tokens"] + completion["tokens"],
            token_logprobs=prompt["token_logprobs"] + completion["token_logprobs"],
            top_logprobs=prompt["top_logprobs"] + completion["top_logprobs"],
            text_offset=prompt["text_offset"] + completion["text_offset"],
        )


def _text_of(prompt: Prompt) -> str:
    """A legacy prompt's text (a chat prompt, messages, has none to echo)."""
    return prompt if isinstance(prompt, str) else ""
