"""The OpenAI Responses request (``POST /v1/responses``) as Meshnet accepts it: stateless.

An adapter (ADR-0024): :func:`responses_params_parse` validates the body
(:class:`ResponsesRequest`, its one declaration) and translates it into what
the chat endpoint would have asked for, then into the same
:class:`~tracker_app.completions.parameters.GenerationParams` the proxy runs.
``instructions`` open the messages as a system message; ``input`` is a text
(one user message) or items: messages (``input_text``/``output_text`` parts),
``function_call`` items (an assistant's tool calls) and
``function_call_output`` items (a ``role: "tool"`` result). Function tools,
``tool_choice`` and ``parallel_tool_calls`` are the chat's; ``text.format``
(``json_schema``, ``json_object``) is the chat's ``response_format``: the same
grammar.

Nothing is kept (ADR-0024): ``store`` may be false or absent (the answer says
``store: false``), and ``store: true`` or a ``previous_response_id`` is a 400.
Like OpenAI's API, this endpoint refuses fields it does not know: a field
Meshnet cannot honour is a 400 naming it, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.generate import speculation_allowed
from nodes_app.protocol.limits import DEFAULT_MAX_TOKENS
from nodes_app.protocol.sampling import (
    SAMPLING_VALUES,
    TEMPERATURE_MAX,
    TOP_P_MIN,
    SamplingParams,
)
from tracker_app.completions.parameters import (
    MAX_MAX_TOKENS,
    GenerationParams,
    Refused,
    UnsupportedParameter,
    fields_refuse,
    fields_validate,
    request_fields,
    speculation_field,
)
from tracker_app.completions.structured import UnfollowableFormat, response_format_grammar
from tracker_app.completions.tools import UnusableTools, conversation, tool_use_parse

RESPONSES_REFUSED: tuple[Refused, ...] = (
    Refused("store", (None, False), "nothing is kept: send store false"),
    Refused("previous_response_id", (None,), "nothing is kept: send the whole input"),
    Refused("conversation", (None,), "nothing is kept: send the whole input"),
    Refused("background", (None, False), "no background responses"),
    Refused("include", (None, []), "nothing more to include"),
    Refused("reasoning", (None, {}), "no reasoning controls"),
    Refused("truncation", (None, "disabled"), "no truncation: a prompt too long is refused"),
    Refused("service_tier", (None, "auto", "default"), "one service tier"),
    Refused("top_logprobs", (None, 0), "no log-probabilities here: use chat completions"),
    Refused("max_tool_calls", (None,), "no limit on calls: use parallel_tool_calls"),
    Refused("prompt", (None,), "no stored prompts"),
    Refused("stream_options", (None, {}, {"include_obfuscation": False}), "no obfuscation"),
)

_FORMATS = {"text", "json_object", "json_schema"}


class ResponsesRequest(serializers.Serializer[dict[str, Any]]):
    """What :func:`responses_params_parse` accepts: every field, range and default."""

    model = serializers.CharField(max_length=64)
    input = serializers.JSONField()
    instructions = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, trim_whitespace=False
    )
    max_output_tokens = serializers.IntegerField(
        min_value=1, max_value=MAX_MAX_TOKENS, required=False, allow_null=True
    )
    stream = serializers.BooleanField(default=False)
    temperature = serializers.FloatField(
        min_value=0.0, max_value=TEMPERATURE_MAX, required=False, allow_null=True
    )
    top_p = serializers.FloatField(
        min_value=TOP_P_MIN, max_value=1.0, required=False, allow_null=True
    )
    tools = serializers.JSONField(required=False, allow_null=True)
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    parallel_tool_calls = serializers.BooleanField(required=False, allow_null=True)
    text = serializers.JSONField(required=False, allow_null=True)
    # Identify the caller or group prompts for the operator: nothing to honour.
    metadata = serializers.DictField(required=False, allow_null=True)
    user = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    safety_identifier = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    prompt_cache_key = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    # Meshnet's extension: the node ids of a pinned route.
    route = serializers.ListField(
        child=serializers.CharField(max_length=64), allow_empty=False, required=False
    )
    speculation = speculation_field()

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, Mapping):
            fields_refuse(data, api="Responses", known=self.fields, refused=RESPONSES_REFUSED)
        return super().to_internal_value(data)

    def validate_input(self, value: Any) -> list[dict[str, Any]]:
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        if not isinstance(value, list) or not value:
            raise serializers.ValidationError("must be a text or a non-empty list of items")
        chat: list[dict[str, Any]] = []
        for index, item in enumerate(value):
            _item_add(chat, item, f"input[{index}]")
        return chat

    def validate_text(self, value: Any) -> str | None:
        """The grammar of ``text.format`` (None: free text)."""
        if value is None:
            return None
        if not isinstance(value, Mapping) or set(value) - {"format", "verbosity"}:
            raise serializers.ValidationError("must be {'format': {...}}")
        if value.get("verbosity") not in (None, "medium"):
            raise UnsupportedParameter(
                "Meshnet does not support text.verbosity (no verbosity controls)", param="text"
            )
        output = value.get("format")
        if output is None:
            return None
        if not isinstance(output, Mapping) or str(output.get("type")) not in _FORMATS:
            raise serializers.ValidationError(f"format.type must be one of {sorted(_FORMATS)}")
        spec = {key: output[key] for key in ("name", "schema", "strict") if key in output}
        asked: dict[str, Any] = {"type": output["type"]}
        if output["type"] == "json_schema":
            asked["json_schema"] = spec
        try:
            return response_format_grammar(asked)
        except UnfollowableFormat as error:
            raise serializers.ValidationError(str(error)) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        try:
            SamplingParams.from_mapping(
                {key: attrs[key] for key in SAMPLING_VALUES if attrs.get(key) is not None}
            )
        except ProtocolError as error:
            raise serializers.ValidationError(error.message) from None
        tools, choice = _chat_tools(attrs.get("tools"), attrs.get("tool_choice"))
        try:
            attrs["tool_use"] = tool_use_parse(tools, choice, attrs.get("parallel_tool_calls"))
        except UnusableTools as error:
            raise serializers.ValidationError({error.param: str(error)}) from None
        if attrs["tool_use"] is not None and attrs.get("text") is not None:
            raise serializers.ValidationError(
                {
                    "text": "a format cannot be combined with tools the model may call (leave "
                    'it out, or set tool_choice to "none")'
                }
            )
        return attrs


def _text_of(content: Any, where: str) -> str:
    """A message's content: a text, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise serializers.ValidationError(f"{where} must be a text or a list of text parts")
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("input_text", "output_text"):
            if isinstance(kind, str):
                raise UnsupportedParameter(
                    f"{where}[{index}]: Meshnet does not support {kind!r} parts (text only)",
                    param="input",
                )
            raise serializers.ValidationError(f"{where}[{index}] must be a text part")
        if not isinstance(part.get("text"), str):
            raise serializers.ValidationError(f"{where}[{index}].text must be a string")
        texts.append(part["text"])
    return "".join(texts)


def _item_add(chat: list[dict[str, Any]], item: Any, where: str) -> None:
    """Add one input item to the chat messages it stands for (consecutive calls are one
    assistant turn)."""
    if not isinstance(item, Mapping):
        raise serializers.ValidationError(f"{where} must be an item object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise serializers.ValidationError(
                f"{where}.role must be user, system, developer or assistant"
            )
        chat.append({"role": role, "content": _text_of(item.get("content"), f"{where}.content")})
    elif kind == "function_call":
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        if not all(isinstance(v, str) for v in (call_id, name, arguments)):
            raise serializers.ValidationError(
                f"{where}: a function_call has a string call_id, name and arguments"
            )
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        last = chat[-1] if chat else None
        if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
            last["tool_calls"].append(call)
        else:
            chat.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise serializers.ValidationError(f"{where}.call_id must be a string")
        output = _text_of(item.get("output"), f"{where}.output")
        chat.append({"role": "tool", "tool_call_id": call_id, "content": output})
    else:
        raise UnsupportedParameter(
            f"{where}: Meshnet does not support {str(kind)[:64]!r} items (messages, "
            "function_call and function_call_output only)",
            param="input",
        )


def _chat_tools(tools: Any, choice: Any) -> tuple[Any, Any]:
    """The Responses API's function tools and ``tool_choice`` as the chat's."""
    if tools is not None and not isinstance(tools, list):
        raise serializers.ValidationError({"tools": "must be a list of tools"})
    functions = []
    for index, tool in enumerate(tools or []):
        where = f"tools[{index}]"
        if not isinstance(tool, Mapping):
            raise serializers.ValidationError({"tools": f"{where} must be an object"})
        if tool.get("type") != "function":
            raise UnsupportedParameter(
                f"{where}: Meshnet does not support {str(tool.get('type'))[:64]!r} tools "
                "(function tools only)",
                param="tools",
            )
        function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
        if function.get("parameters") is None:
            function.pop("parameters", None)
        functions.append({"type": "function", "function": function})
    if isinstance(choice, Mapping):
        if choice.get("type") != "function":
            raise UnsupportedParameter(
                f"Meshnet does not support a {str(choice.get('type'))[:64]!r} tool_choice",
                param="tool_choice",
            )
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return functions, choice


def responses_params_parse(body: bytes) -> GenerationParams:
    """Validate a raw Responses body into what the proxy runs:
    :class:`~tracker_app.completions.parameters.InvalidRequest` names every bad field,
    :class:`~tracker_app.completions.parameters.UnsupportedParameter` what Meshnet
    does not honour."""
    raw = request_fields(body)
    v = fields_validate(ResponsesRequest(data=raw))
    use = v["tool_use"]
    instructions = v.get("instructions")
    chat = ([{"role": "system", "content": instructions}] if instructions else []) + v["input"]

    def given(name: str, default: Any) -> Any:
        value = v.get(name)
        return default if value is None else value

    return GenerationParams(
        model=v["model"],
        prompts=(conversation(chat, use),),
        stream=v["stream"],
        max_tokens=given("max_output_tokens", DEFAULT_MAX_TOKENS),
        temperature=given("temperature", 1.0),
        top_p=given("top_p", 1.0),
        route=v.get("route"),
        speculation=speculation_allowed(v.get("speculation")),
        grammar=use.grammar if use is not None else v.get("text"),
        format_param="text",
        tool_use=use,
        messages=tuple(chat),
        echoed=_echoed(raw),
    )


# What a response repeats of its request, with OpenAI's defaults.
ECHOED: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "temperature": 1.0,
    "top_p": 1.0,
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "text": {"format": {"type": "text"}},
    "metadata": {},
}


def _echoed(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {key: default if raw.get(key) is None else raw[key] for key, default in ECHOED.items()}
