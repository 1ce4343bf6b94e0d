"""The OpenAI chat request (``POST /v1/chat/completions``) as Meshnet accepts it.

:class:`ChatCompletionRequest` is the one declaration of the body: it
validates it and the OpenAPI schema documents it
(:mod:`~tracker_app.completions.schema`). :func:`chat_params_parse` turns a
raw body into :class:`~tracker_app.completions.parameters.GenerationParams`,
what the proxy runs, or raises a 400 naming every bad field, or every OpenAI
parameter Meshnet does not honour. Limits that also bind the nodes (stop
sequences) are the protocol's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from nodes_app.protocol.limits import DEFAULT_MAX_TOKENS, TOP_LOGPROBS_MAX
from nodes_app.shared.prompting import renders_tool_calls
from tracker_app.completions.parameters import (
    CHAT_REFUSED,
    DEFAULT_MAX_CHOICES,
    MAX_MAX_TOKENS,
    GenerationFields,
    GenerationParams,
    InvalidRequest,
    fields_validate,
    generation_params,
    request_fields,
)
from tracker_app.completions.prompt_tokens import model_text
from tracker_app.completions.structured import ResponseFormatField
from tracker_app.completions.tools import (
    UnusableTools,
    conversation,
    native_conversation,
    tool_use_parse,
)

# A chat's tokens when the client sets no limit: the head's own default (OpenAI has none).
CHAT_DEFAULT_MAX_TOKENS = DEFAULT_MAX_TOKENS

ROLES = ("system", "user", "assistant", "developer", "tool")

_TEXT_PART = {
    "type": "object",
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
    "required": ["type", "text"],
}


class ContentPart(serializers.Serializer[dict[str, Any]]):
    type = serializers.ChoiceField(choices=["text"])
    text = serializers.CharField(allow_blank=True, trim_whitespace=False)


@extend_schema_field({"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]})
class MessageContent(serializers.JSONField):
    """``content``: plain text, or OpenAI's list of text parts (joined in order)."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            parts = ContentPart(data=value, many=True)
            parts.is_valid(raise_exception=True)
            return "".join(part["text"] for part in parts.validated_data)
        raise serializers.ValidationError("must be a string or a list of text parts")


_TOOL_CALL = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"type": "string", "enum": ["function"]},
        "function": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
            "required": ["name", "arguments"],
        },
    },
    "required": ["id", "type", "function"],
}


class ToolCallFunction(serializers.Serializer[dict[str, Any]]):
    name = serializers.CharField(max_length=64)
    arguments = serializers.CharField(allow_blank=True, trim_whitespace=False)


class ToolCallMessage(serializers.Serializer[dict[str, Any]]):
    id = serializers.CharField(max_length=128)
    type = serializers.ChoiceField(choices=["function"])
    function = ToolCallFunction()


@extend_schema_serializer(component_name="ChatMessage")
class ChatMessage(serializers.Serializer[dict[str, Any]]):
    role = serializers.ChoiceField(choices=ROLES)
    # Null only for an assistant's turn that made tool calls.
    content = MessageContent(required=False, allow_null=True)
    tool_calls = ToolCallMessage(many=True, required=False)
    tool_call_id = serializers.CharField(max_length=128, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("content") is None and not (
            attrs["role"] == "assistant" and attrs.get("tool_calls")
        ):
            raise serializers.ValidationError(
                {"content": "is required, unless an assistant's turn makes tool calls"}
            )
        if attrs["role"] == "tool" and not attrs.get("tool_call_id"):
            raise serializers.ValidationError(
                {"tool_call_id": "a tool's result names the call it answers"}
            )
        return attrs


@extend_schema_serializer(component_name="ChatCompletion")
class ChatCompletionRequest(GenerationFields):
    refused = CHAT_REFUSED
    # What :func:`chat_params_parse` accepts: every field, range and default.

    messages = ChatMessage(many=True, allow_empty=False)
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
    response_format = ResponseFormatField(required=False, allow_null=True)
    tools = serializers.JSONField(required=False, allow_null=True)
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    parallel_tool_calls = serializers.JSONField(required=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if (attrs.get("top_logprobs") or 0) > 0 and not attrs.get("logprobs"):
            raise serializers.ValidationError({"top_logprobs": "needs logprobs: true"})
        try:
            attrs["tool_use"] = tool_use_parse(
                attrs.get("tools"), attrs.get("tool_choice"), attrs.get("parallel_tool_calls")
            )
        except UnusableTools as error:
            raise serializers.ValidationError({error.param: str(error)}) from None
        if attrs["tool_use"] is not None and attrs.get("response_format") is not None:
            raise serializers.ValidationError(
                {
                    "response_format": "cannot be combined with tools the model may call "
                    '(leave it out, or set tool_choice to "none")'
                }
            )
        return super().validate(attrs)


def chat_params_parse(body: bytes, *, max_choices: int = DEFAULT_MAX_CHOICES) -> GenerationParams:
    """Validate a raw chat request body: :class:`~tracker_app.completions.parameters.InvalidRequest`
    names every bad field, :class:`~tracker_app.completions.parameters.UnsupportedParameter` every
    OpenAI parameter Meshnet does not honour. ``max_choices``: MESHNET_MAX_CHOICES."""
    raw = request_fields(body)
    v = fields_validate(ChatCompletionRequest(data=raw, context={"max_choices": max_choices}))
    use = v["tool_use"]
    messages = conversation(v["messages"], use)
    return generation_params(
        v,
        prompts=(messages,),
        max_tokens=v.get("max_completion_tokens") or v.get("max_tokens") or CHAT_DEFAULT_MAX_TOKENS,
        logprobs=bool(v.get("logprobs")),
        top_logprobs=v.get("top_logprobs") or 0,
        grammar=use.grammar if use is not None else v.get("response_format"),
        tool_use=use,
        messages=tuple(v["messages"]),
    )


def chat_params_for_model(params: GenerationParams, *, weight_source: str) -> GenerationParams:
    """``params`` for the model at ``weight_source``: as parsed (the generic tool prompt)
    unless the model's chat template renders tool calls itself
    (:func:`nodes_app.shared.prompting.renders_tool_calls`); then the messages go to it whole
    with the tools, and the answer's calls are its own ``<tool_call>`` blocks.

    Loads the tokenizer once per process (as the prompt count does) and builds the
    grammar: call it off the event loop. Raises
    :class:`~tracker_app.completions.parameters.InvalidRequest` for a grammar larger than
    a node takes."""
    text = model_text(weight_source)
    if text is None or not renders_tool_calls(text.tokenizer):
        return params
    use = params.tool_use
    if use is None:
        return replace(params, prompts=(native_conversation(params.messages),))
    use = replace(use, native=True)
    try:
        grammar = use.grammar
    except UnusableTools as error:
        raise InvalidRequest(f"{error.param}: {error}", param=error.param) from None
    return replace(
        params,
        prompts=(native_conversation(params.messages),),
        grammar=grammar,
        tool_use=use,
        template_tools=tuple(use.template_tools()),
    )
