"""Tool calls: OpenAI's ``tools`` and ``tool_choice`` on a model that only writes text.

Two ways, by the model's chat template (ADR-0022). A template that renders
tools itself and writes calls as Hermes-style blocks
(:func:`nodes_app.shared.prompting.renders_tool_calls`: Qwen2.5, Qwen3, Hermes,
SmolLM3, …) gets the tools and the earlier turns whole
(:func:`native_conversation`), and the answer is its own format, one block
per call:

    <tool_call>
    {"name": "<function>", "arguments": {...}}
    </tool_call>

Any other template (the shipped models') gets a generic prompt (a system
message, :meth:`ToolUse.instructions` put in place by :func:`conversation`)
and the answer is a calls object:

    {"tool_calls": [{"name": "<function>", "arguments": {...}}]}

Either way a grammar the last hop follows constrains the answer: with
``tool_choice`` ``"required"`` or a named function it is calls, with
``"auto"`` either calls or text that does not start as calls do (``<`` or
``{``); each ``arguments`` valid for its function's JSON schema, at most one
call when ``parallel_tool_calls`` is false. :func:`calls_of` reads the calls
back into OpenAI's ``tool_calls``, of an answer cut short those it completed.
With the generic prompt earlier turns are written in the same words: an
assistant's calls as the object it wrote, a ``role: "tool"`` result as a user
turn naming the call it answers.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from llguidance import LLMatcher

from nodes_app.protocol.decoding import json_document
from tracker_app.completions.shapes import CalledFunction, ToolCall
from tracker_app.completions.structured import JSON_LAYOUT, UnfollowableFormat, grammar_bounded

FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
# A Hermes-style template's call, as the model writes it (and its text once written).
CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
WRITTEN_CALL = re.compile(re.escape(CALL_OPEN) + "(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)

Mode = Literal["auto", "required", "named"]


class UnusableTools(ValueError):
    """``tools`` or ``tool_choice`` cannot be used; ``param`` names which, the message why."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class ToolUse:
    """The tools a request offers and how the model must use them (``tool_choice``)."""

    tools: tuple[Tool, ...]
    mode: Mode
    named: str | None = None  # the function ``tool_choice`` names
    parallel: bool = True
    # The model's chat template renders the tools, and calls are its <tool_call> blocks.
    native: bool = False

    @property
    def callable(self) -> tuple[Tool, ...]:
        """The tools the answer may call."""
        return tuple(t for t in self.tools if self.named is None or t.name == self.named)

    @property
    def single(self) -> bool:
        """At most one call."""
        return not self.parallel or self.named is not None

    @property
    def calls_open(self) -> str:
        """How an answer that makes calls starts (text in ``auto`` mode never does)."""
        return "<" if self.native else "{"

    def template_tools(self) -> list[dict[str, Any]]:
        """The tools as a chat template that renders them takes them (OpenAI's shape; no
        description where the client gave none)."""
        return [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    **({"description": tool.description} if tool.description else {}),
                    "parameters": dict(tool.parameters),
                },
            }
            for tool in self.tools
        ]

    def calls_schema(self) -> dict[str, Any]:
        """The JSON schema of the calls object."""
        calls: dict[str, Any] = {
            "type": "array",
            "minItems": 1,
            "items": {"anyOf": [_call_schema(tool) for tool in self.callable]},
        }
        if self.single:
            calls["maxItems"] = 1
        return {
            "type": "object",
            "properties": {"tool_calls": calls},
            "required": ["tool_calls"],
            "additionalProperties": False,
            "x-guidance": dict(JSON_LAYOUT),
        }

    @cached_property
    def grammar(self) -> str:
        """The grammar of an answer: the calls object, or in ``auto`` mode text too.

        Raises :class:`UnusableTools` (``tools``) when it is larger than a node takes;
        whether it can be followed is checked off the event loop
        (``prompt_tokens.grammar_check``).
        """
        if self.native:
            call = {
                "anyOf": [_call_schema(tool) for tool in self.callable],
                "x-guidance": dict(JSON_LAYOUT),
            }
            more = "" if self.single else ' ("\\n" call)*'
            rules = (
                f"calls: call{more}\n"
                f"call: {json.dumps(CALL_OPEN)} %json {json.dumps(call)} {json.dumps(CALL_CLOSE)}"
            )
        else:
            rules = f"calls: %json {json.dumps(self.calls_schema())}"
        lark = f"start: calls\n{rules}"
        if self.mode == "auto":
            # The first character tells text from calls.
            lark = f"start: TEXT | calls\nTEXT: /[^{self.calls_open}](.|\\n)*/\n{rules}"
        try:
            return grammar_bounded(LLMatcher.grammar_from_lark(lark), what="the tools' parameters")
        except UnfollowableFormat as error:
            raise UnusableTools(str(error), param="tools") from None

    def instructions(self) -> str:
        """The generic prompt describing the tools and the calls object."""
        lines = ["You can call these functions (their arguments as JSON Schema):"]
        for tool in self.tools:
            described = f": {tool.description}" if tool.description else ""
            lines.append(f"- {tool.name}{described} Arguments: {json.dumps(tool.parameters)}")
        lines.append(
            'To call functions, answer with only this JSON: {"tool_calls": [{"name": '
            '"<function name>", "arguments": {<its arguments>}}]}.'
        )
        if self.mode == "auto":
            lines.append("Call a function only if it helps; otherwise answer in text.")
        elif self.named is not None:
            lines.append(f"Call {self.named} now.")
        else:
            lines.append("Call one or more of the functions now.")
        if not self.parallel:
            lines.append("Make at most one call.")

        return "\n".join(lines)


def _call_schema(tool: Tool) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": dict(tool.parameters)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_use_parse(tools: Any, tool_choice: Any, parallel: Any) -> ToolUse | None:
    """The request's :class:`ToolUse`, or None when it asks for no tool calls (no tools,
    or ``tool_choice`` ``"none"``).

    Raises :class:`UnusableTools` for a tool that is not a function with a valid
    unique name and an object schema of parameters, a ``tool_choice`` that is not
    ``"none"``, ``"auto"``, ``"required"`` or a function among the tools, and
    ``"required"`` or a named function without tools.
    """
    offered = _tools(tools)
    mode, named = _choice(tool_choice, offered)
    if mode == "none" or (not offered and mode == "auto"):
        return None
    if not offered:
        raise UnusableTools(f"tool_choice {mode!r} needs tools", param="tool_choice")
    if parallel is not None and not isinstance(parallel, bool):
        raise UnusableTools("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    use = ToolUse(offered, mode, named, parallel is not False)
    _ = use.grammar  # built now: a grammar too large for a node is refused here
    return use


def _tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise UnusableTools("tools must be a list of function tools", param="tools")
    tools: list[Tool] = []
    for index, entry in enumerate(value):
        where = f"tools[{index}]"
        if not isinstance(entry, Mapping) or entry.get("type") != "function":
            raise UnusableTools(f'{where} must be {{"type": "function", ...}}', param="tools")
        function = entry.get("function")
        if not isinstance(function, Mapping):
            raise UnusableTools(f"{where}.function must be an object", param="tools")
        name = function.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
            raise UnusableTools(
                f"{where}.function.name must be 1-64 letters, digits, '_' or '-'", param="tools"
            )
        if any(tool.name == name for tool in tools):
            raise UnusableTools(f"{where}: two tools are named {name!r}", param="tools")
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise UnusableTools(f"{where}.function.description must be a string", param="tools")
        parameters = function.get("parameters", NO_ARGUMENTS)
        if not isinstance(parameters, Mapping):
            raise UnusableTools(
                f"{where}.function.parameters must be a JSON Schema object", param="tools"
            )
        tools.append(Tool(name, description, parameters))
    return tuple(tools)


def _choice(value: Any, tools: Sequence[Tool]) -> tuple[Mode | Literal["none"], str | None]:
    if value is None:
        return "auto", None
    if value in ("none", "auto", "required"):
        return value, None
    if isinstance(value, Mapping) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if not any(tool.name == name for tool in tools):
            raise UnusableTools(
                f"tool_choice names {str(name)[:64]!r}, which is not among the tools",
                param="tool_choice",
            )
        return "named", name
    raise UnusableTools(
        'tool_choice must be "none", "auto", "required" or {"type": "function", '
        '"function": {"name": ...}}',
        param="tool_choice",
    )


def calls_text(calls: Sequence[Mapping[str, Any]]) -> str:
    """An assistant's earlier ``tool_calls`` as the calls object it wrote."""
    written = [
        {"name": name, "arguments": arguments} for name, arguments in _calls_made(calls, raw=True)
    ]
    return json.dumps({"tool_calls": written}, separators=(",", ":"))


def _calls_made(calls: Sequence[Mapping[str, Any]], *, raw: bool) -> list[tuple[Any, Any]]:
    """Each earlier call's function name and its arguments parsed from their JSON text;
    arguments that are not a JSON object stay their text with ``raw``, else become an
    object holding it (a template writes arguments as an object)."""
    made = []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json_document(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = arguments
        if not raw and not isinstance(parsed, dict):
            parsed = {"arguments": arguments}
        made.append((function.get("name"), parsed))
    return made


def native_conversation(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a template that renders tool calls gets them: role and text, an
    assistant's ``tool_calls`` as function names and argument objects, a tool result's
    ``tool_call_id``."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        turn: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
        if message.get("tool_calls"):
            turn["tool_calls"] = [
                {"type": "function", "function": {"name": name, "arguments": arguments}}
                for name, arguments in _calls_made(message["tool_calls"], raw=False)
            ]
        if message.get("tool_call_id"):
            turn["tool_call_id"] = message["tool_call_id"]
        turns.append(turn)
    return turns


@dataclass(frozen=True)
class AnswerCalls:
    """The calls an answer makes, each with a fresh id: all of them when ``whole``, else
    (an answer cut by ``max_tokens`` or a stop sequence) those it completed before the
    cut, perhaps none."""

    calls: tuple[ToolCall, ...]
    whole: bool


def calls_of(text: str, use: ToolUse) -> AnswerCalls | None:
    """The calls an answer makes (:class:`AnswerCalls`), or None when it is text (it does
    not open as calls do). The grammar makes the calls well formed up to where the
    answer ends, so every call whose object was closed is complete."""
    if not text.startswith(use.calls_open):
        return None
    made, whole = _native_calls(text) if use.native else _generic_calls(text)
    calls = tuple(
        ToolCall(
            id=f"call_{secrets.token_hex(12)}",
            type="function",
            function=CalledFunction(
                name=call["name"],
                arguments=json.dumps(call["arguments"], separators=(",", ":")),
            ),
        )
        for call in made
        if isinstance(call, dict) and isinstance(call.get("name"), str) and "arguments" in call
    )
    return AnswerCalls(calls, whole and bool(calls))


def _native_calls(text: str) -> tuple[list[Any], bool]:
    """The complete ``<tool_call>`` blocks' calls, and whether the text is nothing else."""
    written = WRITTEN_CALL.findall(text)
    calls = []
    for block in written:
        try:
            calls.append(json_document(block))
        except ValueError:
            return calls, False
    whole = text == "\n".join(CALL_OPEN + block + CALL_CLOSE for block in written)
    return calls, whole


_CALLS_OPENING = re.compile(r'\{\s*"tool_calls"\s*:\s*\[\s*')
_NEXT_CALL = re.compile(r"\s*,\s*")
_DECODER = json.JSONDecoder()


def _generic_calls(text: str) -> tuple[list[Any], bool]:
    """The calls object's calls, and whether it is whole; of a cut one, the calls whose
    objects were closed before the cut."""
    try:
        return list(json_document(text)["tool_calls"]), True
    except (ValueError, KeyError, TypeError):
        pass
    opening = _CALLS_OPENING.match(text)
    calls: list[Any] = []
    at = opening.end() if opening is not None else None
    while at is not None:
        try:
            call, end = _DECODER.raw_decode(text, at)
        except (ValueError, RecursionError):
            break
        calls.append(call)
        following = _NEXT_CALL.match(text, end)
        at = following.end() if following is not None else None
    return calls, False


def conversation(
    messages: Sequence[Mapping[str, Any]], use: ToolUse | None
) -> list[dict[str, str]]:
    """The messages as the chat template gets them: role and text only.

    An assistant's ``tool_calls`` become the calls object it wrote; each
    ``role: "tool"`` result a user turn naming the function and call it
    answers (consecutive results one turn); with ``use``, its instructions
    open the system message (a new one, or the first one's text first).
    """
    names = {
        call.get("id"): (call.get("function") or {}).get("name")
        for message in messages
        for call in message.get("tool_calls") or ()
    }
    turns: list[dict[str, str]] = []
    results = False  # the last turn holds tool results
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "tool":
            call = message.get("tool_call_id") or ""
            result = f"Result of {names.get(call) or 'a function'} (call {call}): {content}"
            if results:
                turns[-1]["content"] += "\n" + result
            else:
                turns.append({"role": "user", "content": result})
            results = True
            continue
        if role == "assistant" and message.get("tool_calls"):
            written = calls_text(message["tool_calls"])
            content = f"{content}\n{written}" if content else written
        turns.append({"role": role, "content": content})
        results = False
    if use is None:
        return turns
    if turns and turns[0]["role"] == "system":
        turns[0]["content"] += "\n\n" + use.instructions()
        return turns
    return [{"role": "system", "content": use.instructions()}, *turns]
