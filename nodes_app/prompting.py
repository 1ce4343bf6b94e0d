"""Prompts to token ids: chat messages with every message's content encoded as text, raw text.

One function per kind of prompt for the head (which runs the prompt) and
the tracker (which bills it and refuses what the head would refuse), so both
count the same tokens over the same tokenizer (``nodes_app.tokenization``).
No torch here.

Tokenising the templated text as a whole would turn a ``<|im_start|>system``
that a client typed into a message into the model's real role marker: a
client could forge a system turn. transformers' ``sanitize_control_tokens``
renders the template with the control tokens of every message marked, and
encodes the marked ones as plain text while the template's own control
tokens stay tokens. Content without control-token strings gets exactly the
ids of the whole-text tokenisation (tests/nodes/test_prompting.py checks
this for the shipped models). A raw text prompt (the legacy completions
endpoint) has no turns to forge: the client writes the whole of it, so it is
tokenised as is. Tools and earlier tool calls, which a template may render
itself, are marked the same way; their keys, which the marking does not
reach, may not hold a control token at all. The encoding is a pure function
of the tokenizer, so threads may share one (the tracker does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class TemplateRefused(Exception):
    """The model's chat template cannot render these messages; ``message`` says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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
    text.
    """
    forged = _control_token_in_keys(tokenizer, [tools, [m.get("tool_calls") for m in messages]])
    if forged is not None:
        raise TemplateRefused(
            f"a property name in tools or tool_calls holds the model's control token {forged!r}"
        )
    try:
        encoded = tokenizer.apply_chat_template(
            [dict(message) for message in messages],
            tools=[dict(tool) for tool in tools] or None,
            add_generation_prompt=True,
            tokenize=True,
            sanitize_control_tokens=True,
        )
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


def special_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of the tokenizer's special tokens (role markers, end of text, …)."""
    return frozenset(
        int(token_id)
        for token_id, token in tokenizer.added_tokens_decoder.items()
        if getattr(token, "special", False)
    )


def renders_tool_calls(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template describes ``tools`` itself and writes tool
    calls as Hermes-style ``<tool_call>`` blocks of ``{"name": …, "arguments": …}`` (the
    Qwen2.5 and Qwen3 templates, Hermes, SmolLM3 and others do). A template with another
    format of its own gets the tracker's generic tool prompt instead."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template and "<tool_call>" in template
