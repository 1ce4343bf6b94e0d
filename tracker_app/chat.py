"""The OpenAI chat request as Meshnet accepts it, and the chunks it answers with.

``chat_params_parse`` turns a raw request body into ``ChatParams`` or raises
``InvalidChatRequest`` (400) naming every bad field; ``completion_chunk`` and
``completion_reply`` give OpenAI's ``chat.completion.chunk`` /
``chat.completion`` shapes (the chunk's is the protocol's, shared with the
head); :class:`ContentEvents` writes a text chunk's server-sent event with the
request's fixed fields encoded once, not once per token. Limits that also
bind the nodes (stop sequences) are the protocol's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rest_framework import serializers

from meshnet_site.errors import DomainError, ErrorKind, validation_message
from nodes_app.protocol import (
    DEFAULT_MAX_TOKENS,
    PENALTY_MAX,
    PENALTY_MIN,
    SEED_MAX,
    TEMPERATURE_MAX,
    TOP_K_MAX,
    TOP_P_MIN,
    ProtocolError,
    SamplingParams,
    completion_chunk,
    sse_event,
    stop_sequences,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ChatParams",
    "ContentEvents",
    "InvalidChatRequest",
    "chat_params_parse",
    "completion_chunk",
    "completion_reply",
]

MAX_MAX_TOKENS = 4096
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


class _ChatRequest(serializers.Serializer[dict[str, Any]]):
    model = serializers.CharField(max_length=64)
    messages = _Message(many=True, allow_empty=False)
    stream = serializers.BooleanField(default=False)
    max_tokens = serializers.IntegerField(min_value=1, max_value=MAX_MAX_TOKENS, required=False)
    max_completion_tokens = serializers.IntegerField(
        min_value=1, max_value=MAX_MAX_TOKENS, required=False
    )
    # The sampling ranges are the protocol's, which every node checks again.
    temperature = serializers.FloatField(min_value=0.0, max_value=TEMPERATURE_MAX, default=1.0)
    top_p = serializers.FloatField(min_value=TOP_P_MIN, max_value=1.0, default=1.0)
    top_k = serializers.IntegerField(min_value=0, max_value=TOP_K_MAX, default=0)
    seed = serializers.IntegerField(
        min_value=0, max_value=SEED_MAX, required=False, allow_null=True, default=None
    )
    # Accepted for OpenAI clients and range-checked like OpenAI; not applied.
    frequency_penalty = serializers.FloatField(
        min_value=PENALTY_MIN, max_value=PENALTY_MAX, required=False
    )
    presence_penalty = serializers.FloatField(
        min_value=PENALTY_MIN, max_value=PENALTY_MAX, required=False
    )
    stop = serializers.JSONField(required=False, default=None, allow_null=True)
    n = serializers.IntegerField(min_value=1, max_value=1, default=1)
    route = serializers.ListField(
        child=serializers.CharField(max_length=64), allow_empty=False, required=False
    )
    user = serializers.CharField(required=False, allow_blank=True)

    def validate_stop(self, value: Any) -> list[str]:
        try:
            return stop_sequences(value)
        except ProtocolError as error:
            raise serializers.ValidationError(error.message) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # The nodes' own check, so the tracker never forwards what a node refuses.
        try:
            SamplingParams.from_mapping(
                {key: attrs[key] for key in ("temperature", "top_p", "top_k", "seed")}
            )
        except ProtocolError as error:
            raise serializers.ValidationError(error.message) from None
        return attrs


class InvalidChatRequest(DomainError):
    """The chat request body is not one Meshnet can serve; the message names why."""

    kind = ErrorKind.INVALID
    code = "invalid_request"


@dataclass(frozen=True)
class ChatParams:
    model: str
    messages: list[dict[str, str]]
    stream: bool
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: list[str]
    route: list[str] | None

    @property
    def sampling(self) -> SamplingParams:
        """The sampling parameters the head node takes."""
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed
        )


def _no_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON itself does not allow.
    raise json.JSONDecodeError(f"{name} is not a JSON value", name, 0)


def chat_params_parse(body: bytes) -> ChatParams:
    """Validate a raw chat request body; :class:`InvalidChatRequest` names what is wrong."""
    try:
        raw = json.loads(body or b"null", parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidChatRequest(
            f"Request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(raw, dict):
        raise InvalidChatRequest("Request body must be a JSON object")
    data = _ChatRequest(data=raw)
    if not data.is_valid():
        raise InvalidChatRequest(validation_message(data.errors))
    v = data.validated_data
    return ChatParams(
        model=v["model"],
        messages=[{"role": m["role"], "content": m["content"]} for m in v["messages"]],
        stream=v["stream"],
        max_tokens=v.get("max_completion_tokens") or v.get("max_tokens") or DEFAULT_MAX_TOKENS,
        temperature=v["temperature"],
        top_p=v["top_p"],
        top_k=v["top_k"],
        seed=v["seed"],
        stop=v["stop"],
        route=v.get("route"),
    )


def completion_reply(
    *,
    completion_id: str,
    created: int,
    model: str,
    content: str,
    finish_reason: str,
    usage: dict[str, int],
    meshnet: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
        "meshnet": meshnet,
    }


# Stands for the text in the one encoding of a request's text chunk (NULs: no
# model name or id the tracker accepts holds them, and they are escaped in JSON).
_TEXT_MARK = "\x00meshnet-text\x00"


@dataclass(frozen=True)
class ContentEvents:
    """The client's server-sent event of one text chunk of a request, byte for byte
    ``sse_event(completion_chunk(…, delta={"content": text}))``.

    Everything but the text (id, created, model, the choice's frame) is
    encoded once per request; each token costs the JSON of its text only.
    """

    before: bytes
    after: bytes

    @classmethod
    def of(cls, *, completion_id: str, created: int, model: str) -> ContentEvents:
        event = sse_event(
            completion_chunk(
                completion_id=completion_id,
                created=created,
                model=model,
                delta={"content": _TEXT_MARK},
            )
        )
        # The text comes after every other string field of the chunk: its mark is the last.
        before, _, after = event.rpartition(json.dumps(_TEXT_MARK).encode())
        return cls(before=before, after=after)

    def event(self, text: str) -> bytes:
        return self.before + json.dumps(text).encode() + self.after
