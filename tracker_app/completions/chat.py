"""The OpenAI chat request as Meshnet accepts it, and the chunks it answers with.

``chat_params_parse`` turns a raw request body into
:class:`~tracker_app.completions.parameters.GenerationParams` or raises a 400 naming every
bad field, or every OpenAI parameter Meshnet does not honour.
:class:`ChatAnswer` gives OpenAI's ``chat.completion.chunk`` /
``chat.completion`` shapes (the chunk's is the protocol's, shared with the
head, indexed by choice). Limits that also bind the nodes (stop sequences)
are the protocol's.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from rest_framework import serializers

from nodes_app.protocol.frames import completion_chunk
from nodes_app.protocol.limits import DEFAULT_MAX_TOKENS, TOP_LOGPROBS_MAX
from nodes_app.protocol.sse import sse_event
from tracker_app.completions.answers import TextEvents
from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.parameters import (
    CHAT_REFUSED,
    DEFAULT_MAX_CHOICES,
    MAX_MAX_TOKENS,
    GenerationFields,
    GenerationParams,
    fields_validate,
    generation_params,
    request_fields,
    unsupported_refuse,
)

__all__ = ["CHAT_DEFAULT_MAX_TOKENS", "ChatAnswer", "chat_params_parse", "choice_chunk"]

# A chat's tokens when the client sets no limit: the head's own default (OpenAI has none).
CHAT_DEFAULT_MAX_TOKENS = DEFAULT_MAX_TOKENS

ROLES = ("system", "user", "assistant", "developer", "tool")


class _ContentPart(serializers.Serializer[dict[str, Any]]):
    type = serializers.ChoiceField(choices=["text"])
    text = serializers.CharField(allow_blank=True, trim_whitespace=False)


class _Message(serializers.Serializer[dict[str, Any]]):
    role = serializers.ChoiceField(choices=ROLES)
    content = serializers.JSONField()

    def validate_content(self, value: Any) -> str:
        """Plain text, or OpenAI's list of text parts joined in order."""
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            parts = _ContentPart(data=value, many=True)
            parts.is_valid(raise_exception=True)
            return "".join(part["text"] for part in parts.validated_data)
        raise serializers.ValidationError("must be a string or a list of text parts")


class _ChatRequest(GenerationFields):
    messages = _Message(many=True, allow_empty=False)
    max_tokens = serializers.IntegerField(
        min_value=1, max_value=MAX_MAX_TOKENS, required=False, allow_null=True
    )
    max_completion_tokens = serializers.IntegerField(
        min_value=1, max_value=MAX_MAX_TOKENS, required=False, allow_null=True
    )
    logprobs = serializers.BooleanField(required=False, allow_null=True)
    top_logprobs = serializers.IntegerField(
        min_value=0, max_value=TOP_LOGPROBS_MAX, required=False, allow_null=True
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if (attrs.get("top_logprobs") or 0) > 0 and not attrs.get("logprobs"):
            raise serializers.ValidationError({"top_logprobs": "needs logprobs: true"})
        return super().validate(attrs)


def chat_params_parse(body: bytes, *, max_choices: int = DEFAULT_MAX_CHOICES) -> GenerationParams:
    """Validate a raw chat request body: :class:`~tracker_app.completions.parameters.InvalidRequest`
    names every bad field, :class:`~tracker_app.completions.parameters.UnsupportedParameter` every
    OpenAI parameter Meshnet does not honour. ``max_choices``: MESHNET_MAX_CHOICES."""
    raw = request_fields(body)
    unsupported_refuse(raw, CHAT_REFUSED)
    v = fields_validate(_ChatRequest(data=raw))
    messages = [{"role": m["role"], "content": m["content"]} for m in v["messages"]]
    return generation_params(
        v,
        prompts=(messages,),
        max_tokens=v.get("max_completion_tokens") or v.get("max_tokens") or CHAT_DEFAULT_MAX_TOKENS,
        max_choices=max_choices,
        logprobs=bool(v.get("logprobs")),
        top_logprobs=v.get("top_logprobs") or 0,
    )


def choice_chunk(
    *,
    completion_id: str,
    created: int,
    model: str,
    choice: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` of choice ``choice`` (the protocol's shape, indexed)."""
    chunk = completion_chunk(
        completion_id=completion_id,
        created=created,
        model=model,
        delta=delta,
        finish_reason=finish_reason,
        **extra,
    )
    chunk["choices"][0]["index"] = choice
    return chunk


class ChatAnswer:
    """The chat endpoint's answer: ``chat.completion.chunk`` events, each choice opening
    with its role, or one ``chat.completion``."""

    id_prefix = "chatcmpl-"

    def __init__(self, *, completion_id: str, created: int, params: GenerationParams) -> None:
        self.completion_id, self.created, self.model = completion_id, created, params.model
        self.choices = params.choices
        self.logprobs = params.logprobs
        self._text = [
            TextEvents.around(partial(self._text_chunk, choice)) for choice in range(self.choices)
        ]

    def _text_chunk(self, choice: int, text: str) -> dict[str, Any]:
        return self._chunk(choice, delta={"content": text})

    def _chunk(self, choice: int, **fields: Any) -> dict[str, Any]:
        return choice_chunk(
            completion_id=self.completion_id,
            created=self.created,
            model=self.model,
            choice=choice,
            **fields,
        )

    def opening(self, meshnet: dict[str, Any]) -> list[bytes]:
        return [
            sse_event(
                self._chunk(
                    choice,
                    delta={"role": "assistant", "content": ""},
                    **({"meshnet": meshnet} if choice == 0 else {}),
                )
            )
            for choice in range(self.choices)
        ]

    def piece(self, piece: Piece) -> bytes:
        if not piece.logprobs:
            return self._text[piece.choice].event(piece.text)
        content = [entry.to_json() for entry in piece.logprobs]
        return sse_event(self._chunk(piece.choice, delta={"content": piece.text}, logprobs=content))

    def finish(self, choice: int, finish_reason: str, usage: dict[str, int] | None) -> bytes:
        extra = {} if usage is None else {"usage": usage}
        return sse_event(self._chunk(choice, delta={}, finish_reason=finish_reason, **extra))

    def reply(
        self, generations: Sequence[Generation], usage: dict[str, int], meshnet: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "id": self.completion_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": generation.choice,
                    "message": {"role": "assistant", "content": generation.content},
                    "logprobs": (
                        {"content": [entry.to_json() for entry in generation.logprobs]}
                        if self.logprobs
                        else None
                    ),
                    "finish_reason": generation.finish_reason,
                }
                for generation in generations
            ],
            "usage": usage,
            "meshnet": meshnet,
        }
