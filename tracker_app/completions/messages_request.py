"""The Anthropic Messages request (``POST /v1/messages``) as Meshnet accepts it.

An adapter (ADR-0024): :func:`messages_params_parse` validates the body
(:class:`MessagesRequest`, its one declaration) and translates it into what
the chat endpoint would have asked for — OpenAI-shaped messages, function
tools and ``tool_choice`` — then into the same
:class:`~tracker_app.completions.parameters.GenerationParams` the proxy runs:
the same tool prompt and grammar (:mod:`~tracker_app.completions.tools`), and
for a model whose template renders tools the same
:func:`~tracker_app.completions.chat_request.chat_params_for_model`.

The translation: ``system`` opens the messages; a ``tool_use`` block is an
assistant's tool call (``arguments``: its ``input`` as JSON), a ``tool_result``
block a ``role: "tool"`` result of the call it names (``is_error``: its text
says so); ``tool_choice`` ``auto``/``any``/``tool``/``none`` is ``"auto"``,
``"required"``, the named function, ``"none"``; ``disable_parallel_tool_use`` is
``parallel_tool_calls: false``.

Anthropic's API refuses fields it does not know, and so does this endpoint: a
field Meshnet cannot honour (images, extended thinking, server tools, …) is
a 400 naming it, never silently ignored. ``cache_control`` is accepted
anywhere Anthropic takes it: it only asks to reuse a prompt's prefix, which
the nodes decide for themselves. ``output_config.format`` (a JSON schema) is
the chat endpoint's ``response_format``: the same grammar.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.generate import speculation_allowed, stop_sequences
from nodes_app.protocol.sampling import SAMPLING_VALUES, TOP_K_MAX, TOP_P_MIN, SamplingParams
from tracker_app.completions.parameters import (
    MAX_MAX_TOKENS,
    GenerationParams,
    InvalidRequest,
    Refused,
    UnsupportedParameter,
    fields_refuse,
    fields_validate,
    request_fields,
    speculation_field,
)
from tracker_app.completions.structured import UnfollowableFormat, response_format_grammar
from tracker_app.completions.tools import UnusableTools, conversation, tool_use_parse

# Anthropic's temperature runs 0-1 (the nodes take more; Anthropic's range is the contract).
TEMPERATURE_MAX = 1.0

MESSAGES_REFUSED: tuple[Refused, ...] = (
    Refused("thinking", (None, {"type": "disabled"}), "no extended thinking"),
    Refused("service_tier", (None, "auto", "standard_only"), "one service tier"),
    Refused("container", (None,), "no code execution containers"),
    Refused("mcp_servers", (None, []), "no MCP servers"),
    Refused("context_management", (None,), "no context management"),
    Refused("output_format", (None,), "use output_config.format"),
)

_BLOCK_FIELDS = {
    "text": {"type", "text", "cache_control", "citations"},
    "tool_use": {"type", "id", "name", "input", "cache_control"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
}


class MessagesRequest(serializers.Serializer[dict[str, Any]]):
    """What :func:`messages_params_parse` accepts: every field, range and default."""

    model = serializers.CharField(max_length=64)
    max_tokens = serializers.IntegerField(min_value=1, max_value=MAX_MAX_TOKENS)
    messages = serializers.ListField(child=serializers.JSONField(), allow_empty=False)
    system = serializers.JSONField(required=False, allow_null=True)
    stop_sequences = serializers.JSONField(required=False, allow_null=True)
    stream = serializers.BooleanField(default=False)
    temperature = serializers.FloatField(
        min_value=0.0, max_value=TEMPERATURE_MAX, required=False, allow_null=True
    )
    top_p = serializers.FloatField(
        min_value=TOP_P_MIN, max_value=1.0, required=False, allow_null=True
    )
    top_k = serializers.IntegerField(
        min_value=0, max_value=TOP_K_MAX, required=False, allow_null=True
    )
    tools = serializers.JSONField(required=False, allow_null=True)
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    # JSON output: ``{"format": {"type": "json_schema", "schema": …}}``.
    output_config = serializers.JSONField(required=False, allow_null=True)
    # ``user_id`` only identifies the end user to the operator: nothing to honour.
    metadata = serializers.DictField(required=False, allow_null=True)
    # A prompt-caching breakpoint: Meshnet keeps no prompt cache yet, so nothing to mark.
    cache_control = serializers.JSONField(required=False, allow_null=True)
    # Meshnet's extension: the node ids of a pinned route.
    route = serializers.ListField(
        child=serializers.CharField(max_length=64), allow_empty=False, required=False
    )
    speculation = speculation_field()

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, Mapping):
            fields_refuse(data, api="Messages", known=self.fields, refused=MESSAGES_REFUSED)
        return super().to_internal_value(data)

    def validate_system(self, value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        return _texts(value, "system")

    def validate_stop_sequences(self, value: Any) -> list[str]:
        try:
            return stop_sequences(value)
        except ProtocolError as error:
            raise serializers.ValidationError(error.message) from None

    def validate_messages(self, value: list[Any]) -> list[dict[str, Any]]:
        chat: list[dict[str, Any]] = []
        for index, message in enumerate(value):
            chat += _chat_messages(message, f"messages[{index}]")
        return chat

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        try:
            SamplingParams.from_mapping(
                {key: attrs[key] for key in SAMPLING_VALUES if attrs.get(key) is not None}
            )
        except ProtocolError as error:
            raise serializers.ValidationError(error.message) from None
        tools, choice, parallel = _openai_tools(attrs.get("tools"), attrs.get("tool_choice"))
        try:
            attrs["tool_use"] = tool_use_parse(tools, choice, parallel)
        except UnusableTools as error:
            param = "tool_choice" if error.param == "parallel_tool_calls" else error.param
            raise serializers.ValidationError({param: str(error)}) from None
        if attrs["tool_use"] is not None and attrs.get("output_config") is not None:
            raise serializers.ValidationError(
                {
                    "output_config": "cannot be combined with tools the model may call (leave "
                    "it out, or set tool_choice to none)"
                }
            )
        return attrs

    def validate_output_config(self, value: Any) -> str | None:
        """The grammar of ``output_config.format`` (None: free text)."""
        if value is None:
            return None
        if not isinstance(value, Mapping) or set(value) - {"format", "effort"}:
            raise serializers.ValidationError("must be {'format': {...}}")
        if value.get("effort") is not None:
            raise UnsupportedParameter(
                "Meshnet does not support output_config.effort (no reasoning controls)",
                param="output_config",
            )
        output = value.get("format")
        if output is None:
            return None
        if not isinstance(output, Mapping) or output.get("type") != "json_schema":
            raise serializers.ValidationError("format must be {'type': 'json_schema', 'schema'}")
        try:
            return response_format_grammar(
                {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": output.get("schema")},
                }
            )
        except UnfollowableFormat as error:
            raise serializers.ValidationError(str(error)) from None


def _texts(value: Any, where: str) -> str:
    """The text of a list of text blocks (``system``, a tool result's ``content``)."""
    if not isinstance(value, list):
        raise serializers.ValidationError(f"{where} must be a string or a list of text blocks")
    texts = []
    for index, block in enumerate(value):
        _block_check(block, f"{where}[{index}]", allowed=("text",))
        texts.append(block["text"])
    return "".join(texts)


def _block_check(block: Any, where: str, *, allowed: tuple[str, ...]) -> None:
    if not isinstance(block, Mapping):
        raise serializers.ValidationError(f"{where} must be a content block object")
    kind = block.get("type")
    if kind not in allowed:
        if not isinstance(kind, str) or kind in _BLOCK_FIELDS:
            raise serializers.ValidationError(f"{where}: type must be one of {list(allowed)}")
        raise UnsupportedParameter(
            f"{where}: Meshnet does not support {kind!r} content blocks (text, tool_use and "
            "tool_result only)",
            param="messages",
        )
    extra = _asked(block, _BLOCK_FIELDS[kind])
    if extra:
        raise UnsupportedParameter(
            f"{where}: Meshnet does not support {', '.join(map(repr, extra))} in a {kind} block",
            param="messages",
        )
    if kind == "text" and (not isinstance(block.get("text"), str) or block.get("citations")):
        raise serializers.ValidationError(f"{where}.text must be a string (no citations)")


def _asked(value: Mapping[str, Any], known: set[str]) -> list[str]:
    """The fields of ``value`` beyond ``known`` that ask for something (null asks nothing:
    clients write a block's unset fields as null)."""
    return sorted(key for key in set(value) - known if value[key] is not None)


def _chat_messages(message: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic message as the chat messages it stands for."""
    if not isinstance(message, Mapping) or _asked(message, {"role", "content"}):
        raise serializers.ValidationError(f"{where} must be {{'role', 'content'}}")
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise serializers.ValidationError(f"{where}.role must be 'user' or 'assistant'")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise serializers.ValidationError(f"{where}.content must be a string or content blocks")
    allowed = ("text", "tool_use") if role == "assistant" else ("text", "tool_result")
    chat: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        at = f"{where}.content[{index}]"
        _block_check(block, at, allowed=allowed)
        if block["type"] == "text":
            texts.append(block["text"])
        elif block["type"] == "tool_use":
            calls.append(_tool_use(block, at))
        else:
            if texts:  # the user's words before the result keep their place
                chat.append({"role": "user", "content": "".join(texts)})
                texts = []
            chat.append(_tool_result(block, at))
    if role == "assistant":
        turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if calls:
            turn["tool_calls"] = calls
        elif turn["content"] is None:
            turn["content"] = ""
        return [turn]
    if texts or not chat:
        chat.append({"role": "user", "content": "".join(texts)})
    return chat


def _tool_use(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise serializers.ValidationError(f"{where}: a tool_use block has a string id and name")
    if not isinstance(arguments, Mapping):
        raise serializers.ValidationError(f"{where}.input must be an object")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id, content = block.get("tool_use_id"), block.get("content")
    if not isinstance(call_id, str):
        raise serializers.ValidationError(f"{where}.tool_use_id must be a string")
    text = content if isinstance(content, str) else _texts(content or [], f"{where}.content")
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _openai_tools(tools: Any, choice: Any) -> tuple[Any, Any, bool | None]:
    """Anthropic's ``tools`` and ``tool_choice`` as OpenAI's tools, ``tool_choice`` and
    ``parallel_tool_calls`` (what :func:`~tracker_app.completions.tools.tool_use_parse`
    reads)."""
    if tools is not None and not isinstance(tools, list):
        raise serializers.ValidationError({"tools": "must be a list of tools"})
    functions = []
    for index, tool in enumerate(tools or []):
        where = f"tools[{index}]"
        if not isinstance(tool, Mapping):
            raise serializers.ValidationError({"tools": f"{where} must be an object"})
        if tool.get("type") not in (None, "custom"):
            raise UnsupportedParameter(
                f"{where}: Meshnet does not support {tool.get('type')!r} tools (client tools "
                "with an input_schema only)",
                param="tools",
            )
        extra = _asked(tool, {"type", "name", "description", "input_schema", "cache_control"})
        if extra:
            raise UnsupportedParameter(
                f"{where}: Meshnet does not support {', '.join(map(repr, extra))}", param="tools"
            )
        if "input_schema" not in tool:
            raise serializers.ValidationError({"tools": f"{where}.input_schema is required"})
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    if choice is None:
        return functions, None, None
    if not isinstance(choice, Mapping) or set(choice) - {
        "type",
        "name",
        "disable_parallel_tool_use",
    }:
        raise serializers.ValidationError(
            {"tool_choice": "must be {'type': 'auto'|'any'|'tool'|'none', ...}"}
        )
    parallel = (
        not choice["disable_parallel_tool_use"] if "disable_parallel_tool_use" in choice else None
    )
    kind = choice.get("type")
    if kind == "tool":
        named = {"type": "function", "function": {"name": choice.get("name")}}
        return functions, named, parallel
    modes = {"auto": "auto", "any": "required", "none": "none"}
    if not isinstance(kind, str) or kind not in modes:
        raise serializers.ValidationError(
            {"tool_choice": "type must be 'auto', 'any', 'tool' or 'none'"}
        )
    return functions, modes[kind], parallel


def messages_params_parse(body: bytes) -> GenerationParams:
    """Validate a raw Messages body into what the proxy runs:
    :class:`~tracker_app.completions.parameters.InvalidRequest` names every bad field,
    :class:`~tracker_app.completions.parameters.UnsupportedParameter` what Meshnet
    does not honour."""
    raw = request_fields(body)
    v = fields_validate(MessagesRequest(data=raw))
    use = v["tool_use"]
    chat = ([{"role": "system", "content": v["system"]}] if v.get("system") else []) + v["messages"]
    if not any(message["role"] != "system" for message in chat):
        raise InvalidRequest("messages: at least one message is required", param="messages")

    def given(name: str, default: Any) -> Any:
        value = v.get(name)
        return default if value is None else value

    return GenerationParams(
        model=v["model"],
        prompts=(conversation(chat, use),),
        stream=v["stream"],
        max_tokens=v["max_tokens"],
        temperature=given("temperature", 1.0),
        top_p=given("top_p", 1.0),
        top_k=given("top_k", 0),
        stop=v.get("stop_sequences") or [],
        route=v.get("route"),
        speculation=speculation_allowed(v.get("speculation")),
        grammar=use.grammar if use is not None else v.get("output_config"),
        format_param="output_config",
        tool_use=use,
        messages=tuple(chat),
    )
