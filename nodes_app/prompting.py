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
tokenised as is. The encoding is a pure function of the tokenizer, so
threads may share one (the tracker does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TemplateRefused(Exception):
    """The model's chat template cannot render these messages; ``message`` says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def prompt_token_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """The chat template applied to ``messages``, ready for the assistant's turn, as token ids.

    No control token (role marker, end of turn, …) comes from message
    content. Raises :class:`TemplateRefused` when the template rejects the
    messages (its own rules, e.g. role order) or cannot keep their content
    text.
    """
    try:
        encoded = tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True, sanitize_control_tokens=True
        )
    except Exception as error:  # the template's own complaint (jinja raise_exception, …)
        raise TemplateRefused(f"the model's chat template refused the messages: {error}") from error
    return [int(token_id) for token_id in encoded["input_ids"]]


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
