"""The OpenAI chat request as Meshnet accepts it, and the chunks it answers with.

``chat_params_parse`` turns a raw request body into ``ChatParams`` or raises
``ApiError`` (400) naming every bad field; the chunk builders give OpenAI's
``chat.completion`` / ``chat.completion.chunk`` shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rest_framework import serializers

from meshnet_site.errors import ApiError, validation_message

DEFAULT_MAX_TOKENS = 256
MAX_MAX_TOKENS = 4096
MAX_STOP_LENGTH = 256
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
    temperature = serializers.FloatField(min_value=0.0, max_value=2.0, default=1.0)
    top_p = serializers.FloatField(min_value=0.0, max_value=1.0, default=1.0)
    top_k = serializers.IntegerField(min_value=0, default=0)
    seed = serializers.IntegerField(required=False, allow_null=True, default=None)
    stop = serializers.JSONField(required=False, default=None)
    n = serializers.IntegerField(min_value=1, max_value=1, default=1)
    route = serializers.ListField(
        child=serializers.CharField(max_length=64), allow_empty=False, required=False
    )
    user = serializers.CharField(required=False, allow_blank=True)

    def validate_stop(self, value: Any) -> list[str]:
        if value is None:
            return []
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise serializers.ValidationError("must be a non-empty string or a list of them")
        if len(stops) > 4:
            raise serializers.ValidationError("at most 4 stop sequences")
        if any(len(stop) > MAX_STOP_LENGTH for stop in stops):
            raise serializers.ValidationError(f"each at most {MAX_STOP_LENGTH} characters")
        return stops


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

    def sampling(self) -> dict[str, Any]:
        """The sampling fields the head node takes."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop,
        }


def chat_params_parse(body: bytes) -> ChatParams:
    """Validate a raw chat request body; ApiError 400 names what is wrong."""
    try:
        raw = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(raw, dict):
        raise ApiError("Request body must be a JSON object", code="invalid_request")
    data = _ChatRequest(data=raw)
    if not data.is_valid():
        raise ApiError(validation_message(data.errors), code="invalid_request")
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


def completion_chunk(
    *,
    completion_id: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        **extra,
    }


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
