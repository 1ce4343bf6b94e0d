"""OpenAI's legacy text completions (``POST /v1/completions``) as Meshnet accepts them.

What evaluation harnesses use (lm-evaluation-harness's ``local-completions``):
a raw text ``prompt`` (a string, or a list of them: each its own choices) with
no chat template, ``echo`` to get the prompt back with its own token
log-probabilities, ``max_tokens: 0`` with ``echo`` to score a text without
generating. :func:`text_completion_params_parse` reads a body into
:class:`~tracker_app.completions.parameters.GenerationParams` (the same as a chat's, run by
the same proxy); :class:`TextCompletionAnswer` gives the ``text_completion``
shapes, whole and streamed.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from rest_framework import serializers

from nodes_app.protocol.logprobs import TokenLogprob
from nodes_app.protocol.sse import sse_event
from tracker_app.completions.answers import TextEvents
from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.parameters import (
    CHOICES_CEILING,
    COMPLETIONS_REFUSED,
    DEFAULT_MAX_CHOICES,
    MAX_MAX_TOKENS,
    GenerationFields,
    GenerationParams,
    Prompt,
    fields_validate,
    generation_params,
    request_fields,
    unsupported_refuse,
)

# OpenAI's legacy defaults and limits: 16 tokens, the 5 most likely tokens at most.
TEXT_DEFAULT_MAX_TOKENS = 16
LOGPROBS_MAX = 5


class _CompletionRequest(GenerationFields):
    prompt = serializers.JSONField()
    max_tokens = serializers.IntegerField(
        min_value=0, max_value=MAX_MAX_TOKENS, required=False, allow_null=True
    )
    echo = serializers.BooleanField(required=False, allow_null=True)
    logprobs = serializers.IntegerField(
        min_value=0, max_value=LOGPROBS_MAX, required=False, allow_null=True
    )

    def validate_prompt(self, value: Any) -> list[str]:
        """A string, or a list of 1 or more strings; token ids are not taken."""
        prompts = [value] if isinstance(value, str) else value
        if not isinstance(prompts, list) or not prompts:
            raise serializers.ValidationError("must be a string or a non-empty list of strings")
        if not all(isinstance(prompt, str) for prompt in prompts):
            raise serializers.ValidationError(
                "must be text: a string or a list of strings (prompts as token ids are not "
                "supported)"
            )
        if len(prompts) > CHOICES_CEILING:
            raise serializers.ValidationError(f"takes at most {CHOICES_CEILING} prompts")
        return prompts

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("max_tokens") == 0 and not attrs.get("echo"):
            raise serializers.ValidationError(
                {"max_tokens": "may be 0 only with echo: true (to score the prompt alone)"}
            )
        return super().validate(attrs)


def text_completion_params_parse(
    body: bytes, *, max_choices: int = DEFAULT_MAX_CHOICES
) -> GenerationParams:
    """Validate a raw legacy completion body:
    :class:`~tracker_app.completions.parameters.InvalidRequest` names every bad field,
    :class:`~tracker_app.completions.parameters.UnsupportedParameter` every
    OpenAI parameter Meshnet does not honour. ``max_choices``: MESHNET_MAX_CHOICES."""
    raw = request_fields(body)
    unsupported_refuse(raw, COMPLETIONS_REFUSED)
    v = fields_validate(_CompletionRequest(data=raw))
    max_tokens = v.get("max_tokens")
    logprobs = v.get("logprobs")
    return generation_params(
        v,
        prompts=tuple(v["prompt"]),
        max_tokens=TEXT_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        max_choices=max_choices,
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        echo=bool(v.get("echo")),
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
) -> dict[str, Any]:
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
            TextEvents.around(partial(self._chunk, choice)) for choice in range(params.choices)
        ]

    def _chunk(
        self,
        choice: int,
        text: str,
        finish_reason: str | None = None,
        logprobs: dict[str, Any] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        return {
            "id": self.completion_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "text": text,
                    "index": choice,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason,
                }
            ],
            **extra,
        }

    def opening(self, meshnet: dict[str, Any]) -> list[bytes]:
        return [sse_event(self._chunk(0, "", meshnet=meshnet))]

    def piece(self, piece: Piece) -> bytes:
        if not self.logprobs:
            return self._text[piece.choice].event(piece.text)
        logprobs = legacy_logprobs(
            piece.logprobs, top=self.top, offsets=self._offsets[piece.choice], echoed=piece.echo
        )
        return sse_event(self._chunk(piece.choice, piece.text, logprobs=logprobs))

    def finish(self, choice: int, finish_reason: str, usage: dict[str, int] | None) -> bytes:
        extra = {} if usage is None else {"usage": usage}
        return sse_event(self._chunk(choice, "", finish_reason, **extra))

    def reply(
        self, generations: Sequence[Generation], usage: dict[str, int], meshnet: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "id": self.completion_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "text": self._echoed(generation) + generation.content,
                    "index": generation.choice,
                    "logprobs": self._logprobs(generation),
                    "finish_reason": generation.finish_reason,
                }
                for generation in generations
            ],
            "usage": usage,
            "meshnet": meshnet,
        }

    def _echoed(self, generation: Generation) -> str:
        return _text_of(generation.prompt) if self.echo else ""

    def _logprobs(self, generation: Generation) -> dict[str, Any] | None:
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
        return {key: prompt[key] + completion[key] for key in prompt}


def _text_of(prompt: Prompt) -> str:
    """A legacy prompt's text (a chat prompt, messages, has none to echo)."""
    return prompt if isinstance(prompt, str) else ""
