"""Prompts to token ids: chat messages with every message's content encoded as text, raw text.

One function per kind of prompt for the head (which runs the prompt) and
the tracker (which bills it and refuses what the head would refuse), so both
count the same tokens over the same tokenizer (``nodes_app.shared.tokenization``).
No torch here.

Tokenising the templated text as a whole would turn a ``<|im_start|>system``
that a client typed into a message into the model's real role marker: a
client could forge a system turn. transformers' ``sanitize_control_tokens``
renders the template with the control tokens of every message marked, and
encodes the marked ones as plain text while the template's own control
tokens stay tokens. Content without control-token strings gets exactly the
ids of the whole-text tokenisation (tests/nodes/shared/test_prompting.py checks
this for the shipped models). A raw text prompt (the legacy completions
endpoint) has no turns to forge: the client writes the whole of it, so it is
tokenised as is. Tools and earlier tool calls, which a template may render
itself, are marked the same way; their keys, which the marking does not
reach, may not hold a control token at all. The encoding is a pure function
of the tokenizer, so threads may share one (the tracker does).

A chat template is a checkpoint's code, and a checkpoint is input: transformers
renders it in jinja's sandbox (no attribute tricks, ``range`` capped at 100,000),
which bounds neither loops nested in loops nor time. Every render here runs
under :class:`RenderBudget`: at most :data:`TEMPLATE_RENDER_SECONDS` and
:data:`TEMPLATE_RENDER_LINES` lines of template code, past which it is stopped
(:class:`TemplateOverBudget`) and the thread is free again. An honest template
renders a conversation in well under a millisecond.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

# The most a chat template may cost one render: seconds, and lines of template code.
TEMPLATE_RENDER_SECONDS = 2.0
TEMPLATE_RENDER_LINES = 5_000_000
# jinja's name for the code it compiles from a template string.
TEMPLATE_CODE = "<template>"


class TemplateRefused(Exception):
    """The model's chat template cannot render these messages; ``message`` says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TemplateOverBudget(TemplateRefused):
    """The model's chat template ran past :class:`RenderBudget`: the model's fault (its
    operator's to fix), not the messages'."""


class RenderBudget:
    """A bound on one render of a chat template on the calling thread (a context manager).

    Traces only the frames of template code (jinja compiles a template into Python
    code named :data:`TEMPLATE_CODE`), counting their lines; past ``lines`` of them,
    or ``seconds``, the next line raises :class:`TemplateOverBudget` inside the
    template, which unwinds the render. Whatever traced the thread before (a
    coverage tool) is given back afterwards.
    """

    def __init__(
        self, *, seconds: float = TEMPLATE_RENDER_SECONDS, lines: int = TEMPLATE_RENDER_LINES
    ) -> None:
        self.seconds, self.lines = seconds, lines
        self._count = 0
        self._deadline = 0.0
        self._previous: Any = None

    def __enter__(self) -> RenderBudget:
        self._count = 0
        self._deadline = time.monotonic() + self.seconds
        self._previous = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *_: object) -> None:
        sys.settrace(self._previous)

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._line if frame.f_code.co_filename == TEMPLATE_CODE else None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        self._count += 1
        if self._count > self.lines:
            raise TemplateOverBudget(
                f"the model's chat template ran past {self.lines} lines of template code "
                "for one prompt"
            )
        if self._count % 1024 == 0 and time.monotonic() > self._deadline:
            raise TemplateOverBudget(
                f"the model's chat template took more than {self.seconds:g} s to render one prompt"
            )
        return self._line


def prompt_token_ids(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] = (),
) -> list[int]:
    """The chat template applied to ``messages`` (and ``tools``, the function tools a
    template that renders tool calls describes), ready for the assistant's turn, as
    token ids.

    No control token (role marker, end of turn, …) comes from message
    content. Raises :class:`TemplateRefused` when the template rejects the
    messages (its own rules, e.g. role order) or cannot keep their content
    text, :class:`TemplateOverBudget` (a kind of it) when it runs past its
    :class:`RenderBudget`.
    """
    forged = _control_token_in_keys(tokenizer, [tools, [m.get("tool_calls") for m in messages]])
    if forged is not None:
        raise TemplateRefused(
            f"a property name in tools or tool_calls holds the model's control token {forged!r}"
        )
    try:
        with RenderBudget():
            encoded = tokenizer.apply_chat_template(
                [dict(message) for message in messages],
                tools=[dict(tool) for tool in tools] or None,
                add_generation_prompt=True,
                tokenize=True,
                sanitize_control_tokens=True,
            )
    except TemplateOverBudget:
        raise
    except Exception as error:  # the template's own complaint (jinja raise_exception, …)
        raise TemplateRefused(f"the model's chat template refused the messages: {error}") from error
    return [int(token_id) for token_id in encoded["input_ids"]]


def _control_token_in_keys(tokenizer: Any, value: Any) -> str | None:
    """A control token written in a key of ``value``'s objects, if any: the sanitising
    above marks strings, not keys, so a template that writes an object as JSON would
    write such a key's control token as the token itself (a forged turn)."""
    tokens = [token.content for token in tokenizer.added_tokens_decoder.values() if token.special]
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, Mapping):
            for key in item:
                forged = next((t for t in tokens if isinstance(key, str) and t in key), None)
                if forged is not None:
                    return forged
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return None


def text_token_ids(tokenizer: Any, text: str) -> list[int]:
    """A raw text prompt (the legacy completions endpoint) as token ids: no chat template.

    Tokenised as the tokenizer does by default (``tokenizer(text)``: with a
    BOS token if the tokenizer adds one, and control-token strings in the
    text read as those tokens, as a model's own evaluation would).
    """
    return [int(token_id) for token_id in tokenizer(text)["input_ids"]]


def renders_tool_calls(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template describes ``tools`` itself and writes tool
    calls as Hermes-style ``<tool_call>`` blocks of ``{"name": …, "arguments": …}`` (the
    Qwen2.5 and Qwen3 templates, Hermes, SmolLM3 and others do). A template with another
    format of its own gets the tracker's generic tool prompt instead."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template and "<tool_call>" in template
