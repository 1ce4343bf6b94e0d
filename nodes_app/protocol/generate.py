"""The generate request: the body of ``POST {head}/v1/generate`` the tracker sends a head."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from nodes_app.protocol.decoding import FieldDecoder, is_int
from nodes_app.protocol.errors import ProtocolError, refusal
from nodes_app.protocol.limits import (
    DEFAULT_MAX_TOKENS,
    MAX_REQUEST_ID,
    MAX_STOP_LENGTH,
    MAX_STOPS,
    TOP_LOGPROBS_MAX,
)
from nodes_app.protocol.sampling import SAMPLING_FIELDS, SamplingParams
from nodes_app.protocol.signed_plan import PLAN_READERS, PlanHop, SignedPlan

# The values of a request's ``speculation`` field (Meshnet's extension, ADR-0028).
SPECULATION_ON = "on"
SPECULATION_OFF = "off"


@dataclass(frozen=True)
class GenerateRequest:
    """The body of ``POST {head}/v1/generate``.

    The prompt is either chat ``messages`` (the model's chat template applied)
    or a raw text ``prompt`` (the legacy completions endpoint: tokenised as the
    tokenizer does by default, no template); exactly one is given. A message
    is a role and text, and for a template that renders tool calls itself an
    assistant's ``tool_calls`` (each a function's name and arguments object)
    and a tool result's ``tool_call_id``; ``tools`` are then the function tools
    the template describes (OpenAI's ``{"type": "function", "function": …}``).
    ``max_tokens`` is the budget of the whole completion, resumed tokens
    included: the head prefills the prompt plus ``resume_token_ids`` and
    streams only new tokens. ``hops[0]`` is the head itself. ``expires_at``,
    ``nonce`` and ``signature`` are the tracker's seal on the plan, and
    ``max_positions``, ``ends_at`` and ``idle_seconds`` what the plan lets
    each of its sessions hold (see :attr:`plan`).

    ``logprobs``: every frame with token ids also carries each token's
    logprob and its ``top_logprobs`` best alternatives. ``echo``: the first
    frame also carries the prompt's own token logprobs (each given the
    tokens before it); ``max_tokens`` may then be 0 (the prompt is run, no
    token is generated). Logprobs are the model's log-softmax of the last
    hop's float32 logits before temperature, penalties and logit_bias.
    """

    request_id: str
    model: str
    hops: tuple[PlanHop, ...]
    messages: list[dict[str, Any]]
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    resume_token_ids: list[int] = field(default_factory=list)
    expires_at: int = 0
    nonce: str = ""
    signature: str = ""
    prompt: str | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    echo: bool = False
    tools: list[dict[str, Any]] = field(default_factory=list)
    max_positions: int = 0
    ends_at: int = 0
    idle_seconds: int = 0
    # The plan's prefix scope (ADR-0027): "" keeps the request out of every prefix cache.
    prefix_scope: str = ""
    # Whether the head may speculate (ADR-0028); a request's ``"speculation": "off"``
    # turns it off (the body's field is left out when on).
    speculation: bool = True

    @property
    def plan(self) -> SignedPlan:
        """The request's plan with the tracker's seal (unsigned: ``signature`` "")."""
        return SignedPlan(
            self.request_id,
            self.model,
            self.hops,
            self.expires_at,
            self.nonce,
            self.signature,
            max_positions=self.max_positions,
            ends_at=self.ends_at,
            idle_seconds=self.idle_seconds,
            prefix_scope=self.prefix_scope,
        )

    @property
    def prompt_characters(self) -> int:
        """Characters the head tokenises: the raw prompt's, or every message's content
        (and the tool calls and tools its template renders, as JSON)."""
        if self.prompt is not None:
            return len(self.prompt)
        content = sum(len(message["content"]) for message in self.messages)
        calls = [m["tool_calls"] for m in self.messages if "tool_calls" in m]
        return content + (len(json.dumps([calls, self.tools])) if calls or self.tools else 0)

    def to_json(self) -> dict[str, Any]:
        """The JSON object the tracker sends (sampling fields at the top level).

        Fields at their defaults (``prompt``, ``logprobs``, ``top_logprobs``,
        ``echo``, penalties, logit_bias) are left out, so a request that uses
        none of them is the body older heads know.
        """
        plan: dict[str, Any] = {"model": self.model, "hops": [hop.to_json() for hop in self.hops]}
        if self.signature:
            plan.update(
                expires_at=self.expires_at,
                max_positions=self.max_positions,
                ends_at=self.ends_at,
                idle_seconds=self.idle_seconds,
                nonce=self.nonce,
                signature=self.signature,
            )
        if self.prefix_scope:
            plan["prefix_scope"] = self.prefix_scope
        prompt: dict[str, Any] = (
            {"messages": self.messages} if self.prompt is None else {"prompt": self.prompt}
        )
        scoring: dict[str, Any] = {}
        if self.logprobs:
            scoring.update(logprobs=True, top_logprobs=self.top_logprobs)
        if self.echo:
            scoring["echo"] = True
        if self.tools:
            prompt["tools"] = self.tools
        if not self.speculation:
            scoring["speculation"] = SPECULATION_OFF
        return {
            "request_id": self.request_id,
            **prompt,
            "max_tokens": self.max_tokens,
            **self.sampling.to_json(),
            **scoring,
            "stop": self.stop,
            "resume_token_ids": self.resume_token_ids,
            "plan": plan,
        }

    @classmethod
    def parse(cls, body: Any) -> GenerateRequest:
        """Validate a decoded JSON body; :class:`ProtocolError` names the first bad field.

        Checks everything that holds for any node: types, limits, and a plan
        whose hops start at layer 0 and cover the layers contiguously. Whether
        this node is hop 0, serves the model, and which layer is the last is
        for the node to check against its own shard.
        """
        if not isinstance(body, dict):
            raise ProtocolError("body must be a JSON object")
        if (body.get("messages") is None) == (body.get("prompt") is None):
            raise ProtocolError("give exactly one of messages and prompt")
        plan = body.get("plan")
        if not isinstance(plan, dict):
            raise ProtocolError(
                "plan must be an object with a non-empty hops list", code="invalid_plan"
            )
        # The request's fields as one object: the plan's own, and the sampling
        # parameters (top-level fields of the body) as one ``sampling`` object.
        fields = {name: body[name] for name in _BODY_FIELDS if name in body}
        fields.update((name, plan[name]) for name in PLAN_READERS if name in plan)
        fields["sampling"] = {key: body[key] for key in SAMPLING_FIELDS if key in body}
        values = _FIELDS.decode(fields)
        logprobs, echo = values.get("logprobs", False), values.get("echo", False)
        if values.get("top_logprobs") and not logprobs:
            raise ProtocolError("top_logprobs needs logprobs")
        max_tokens, least = values.get("max_tokens", DEFAULT_MAX_TOKENS), 0 if echo else 1
        if not is_int(max_tokens) or max_tokens < least:
            raise ProtocolError(
                f"max_tokens must be an integer of at least {least}"
                + ("" if echo else " (0 only with echo)")
            )
        return cls(**values)


def stop_sequences(value: Any) -> list[str]:
    """``stop`` as a list: None → [], a string → [it]; the one rule both sides apply.

    Raises :class:`ProtocolError` unless it is at most :data:`MAX_STOPS`
    non-empty strings of at most :data:`MAX_STOP_LENGTH` characters.
    """
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ProtocolError("stop must be a non-empty string or a list of them")
    if len(stops) > MAX_STOPS:
        raise ProtocolError(f"stop takes at most {MAX_STOPS} sequences")
    if any(len(stop) > MAX_STOP_LENGTH for stop in stops):
        raise ProtocolError(f"each stop sequence is at most {MAX_STOP_LENGTH} characters")
    return list(stops)


def _request_id(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_REQUEST_ID:
        raise ProtocolError(
            f"request_id must be a non-empty string of at most {MAX_REQUEST_ID} characters"
        )
    return value


def _messages(value: Any) -> list[dict[str, Any]]:
    """Chat messages (none when the request gives a raw prompt instead): role and content,
    an assistant's ``tool_calls`` and a tool result's ``tool_call_id`` where given."""
    if value is None:
        return []
    if not isinstance(value, list) or not value:
        raise ProtocolError("messages must be a non-empty list")
    return [_message(message) for message in value]


def _message(value: Any) -> dict[str, Any]:
    if not (
        isinstance(value, dict)
        and isinstance(value.get("role"), str)
        and isinstance(value.get("content"), str)
    ):
        raise ProtocolError("each message needs a string role and a string content")
    message: dict[str, Any] = {"role": value["role"], "content": value["content"]}
    if value.get("tool_calls") is not None:
        calls = value["tool_calls"]
        if not isinstance(calls, list) or not all(_is_call(call) for call in calls):
            raise ProtocolError(
                'tool_calls must be a list of {"type": "function", "function": {"name": '
                'string, "arguments": object}}'
            )
        message["tool_calls"] = calls
    if value.get("tool_call_id") is not None:
        if not isinstance(value["tool_call_id"], str):
            raise ProtocolError("tool_call_id must be a string")
        message["tool_call_id"] = value["tool_call_id"]
    return message


def _is_call(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return (
        isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("arguments"), dict)
    )


def _tools(value: Any) -> list[dict[str, Any]]:
    """The function tools a chat template renders (none: the template is not told of any)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(_is_tool(tool) for tool in value):
        raise ProtocolError(
            'tools must be a list of {"type": "function", "function": {"name": string, ...}}'
        )
    return value


def _is_tool(tool: Any) -> bool:
    function = tool.get("function") if isinstance(tool, dict) else None
    return (
        tool.get("type") == "function"
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
    )


def _prompt(value: Any) -> str:
    if not isinstance(value, str):
        raise ProtocolError("prompt must be a string")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError("logprobs and echo must be booleans")
    return value


def speculation_allowed(value: Any) -> bool:
    """A request's ``speculation`` field: ``"off"`` → False, ``"on"`` or None → True;
    :class:`ProtocolError` otherwise (the one rule the tracker and a head apply)."""
    if value is None or value == SPECULATION_ON:
        return True
    if value == SPECULATION_OFF:
        return False
    raise ProtocolError(f'speculation must be "{SPECULATION_ON}" or "{SPECULATION_OFF}"')


def _top_logprobs(value: Any) -> int:
    if not is_int(value) or not 0 <= value <= TOP_LOGPROBS_MAX:
        raise ProtocolError(f"top_logprobs must be an integer in 0..{TOP_LOGPROBS_MAX}")
    return value


# The body's own fields (the others are the plan's and the sampling parameters).
_BODY_FIELDS = (
    "request_id",
    "messages",
    "prompt",
    "max_tokens",
    "stop",
    "resume_token_ids",
    "logprobs",
    "top_logprobs",
    "echo",
    "tools",
    "speculation",
)
# A null request id, max_tokens or plan field is refused; any other null field
# takes its default (clients and trackers send null for "not set").
_FIELDS = FieldDecoder(
    GenerateRequest,
    refuse=refusal,
    bad_code="invalid_request",
    readers={
        **PLAN_READERS,
        "request_id": _request_id,
        "messages": _messages,
        "prompt": _prompt,
        "max_tokens": lambda value: value,  # checked with echo, once both are read
        "sampling": SamplingParams.from_mapping,
        "stop": stop_sequences,
        "logprobs": _flag,
        "echo": _flag,
        "top_logprobs": _top_logprobs,
        "tools": _tools,
        "speculation": speculation_allowed,
    },
    null_values=("request_id", "max_tokens", *PLAN_READERS),
)
