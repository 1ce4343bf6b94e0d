"""The tracker's own count of a completion request's prompt tokens, and what it refuses.

A head reports the prompt tokens it ran, but a head is a node operator's
process, trusted to run its layers and nothing more: the tracker bills from
its own count. It loads the model's tokenizer without torch
(:mod:`nodes_app.tokenization`, once per process per weight source) and
tokenises exactly as the head does (:func:`nodes_app.shared.prompting.prompt_token_ids`),
so an honest head always agrees. With the count in hand the tracker refuses,
before routing, what the head would refuse (a template that rejects the
messages, a prompt plus ``max_tokens`` past the context, a grammar the
tokenizer cannot follow), so a head's own refusal afterwards is the head's
fault.

A model whose tokenizer this process cannot load (a hub id: nothing is
downloaded) gets an upper bound from the body instead — every token of a
byte-level or byte-fallback vocabulary covers at least one UTF-8 byte, plus
an allowance per message and for the template's own text — and a head's
count is billed only up to it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from llguidance import LLTokenizer

from meshnet_site.errors import DomainError, ErrorKind
from nodes_app.protocol.limits import ECHO_MAX_SCORES, echo_scores
from nodes_app.shared.grammar import grammar_problem, grammar_words
from nodes_app.shared.prefix_chain import block_hashes
from nodes_app.shared.prompting import (
    TemplateOverBudget,
    TemplateRefused,
    prompt_token_ids,
    text_token_ids,
)
from nodes_app.shared.tokenization import ModelText, TokenizerUnavailable, model_text_load
from routing_app.learning.prefix_memory import RequestPrefix
from tracker_app.completions.parameters import InvalidRequest, Prompt

logger = logging.getLogger(__name__)

# The upper bound for a model without a tokenizer here: role markers, the role and
# separators of one message; a template's own text (a default system prompt).
MESSAGE_ALLOWANCE = 16
TEMPLATE_ALLOWANCE = 256


class ContextLengthExceeded(DomainError):
    """The prompt plus ``max_tokens`` does not fit the model's context."""

    kind = ErrorKind.INVALID
    code = "context_length_exceeded"


class ChatTemplateOverBudget(DomainError):
    """The model's chat template ran past its render budget (``nodes_app.prompting``):
    the model's fault, not the client's; the request fails unbilled."""

    kind = ErrorKind.INTERNAL
    code = "chat_template_over_budget"


@dataclass(frozen=True)
class PromptCount:
    """The tracker's count of a prompt: ``exact``, or an upper bound from the body; and,
    counted in a prefix scope, its chain of block hashes (what routing knows of it)."""

    tokens: int
    exact: bool
    blocks: tuple[str, ...] = ()

    def route_prefix(self, output_tokens: int) -> RequestPrefix:
        """The prompt as the route choice weighs it, for an answer of at most
        ``output_tokens``."""
        return RequestPrefix(
            blocks=self.blocks, prompt_tokens=self.tokens, output_tokens=output_tokens
        )

    def billable(self, reported: int) -> int:
        """The prompt tokens to bill when the head reported ``reported``."""
        return self.tokens if self.exact else min(reported, self.tokens)

    def agrees(self, reported: int) -> bool:
        """Whether a head's report is what an honest head would say."""
        return reported == self.tokens if self.exact else reported <= self.tokens


def prompt_tokens_count(
    *,
    weight_source: str,
    prompt: Prompt,
    max_tokens: int,
    tools: Sequence[Mapping[str, Any]] = (),
    prefix_seed: str = "",
) -> PromptCount:
    """Count ``prompt`` (chat messages, with the ``tools`` a template that renders tool
    calls describes; or a legacy completion's text) for the model at ``weight_source``;
    with a ``prefix_seed`` (the request's scoped ``chain_seed``) the count carries the
    prompt's block chain, as the head will claim it.

    Raises :class:`~tracker_app.completions.parameters.InvalidRequest` (the template rejects the
    messages, a text prompt of no tokens) or :class:`ContextLengthExceeded`
    (400s) where the head would refuse. Tokenises on the calling thread: call
    it off the event loop.
    """
    text = model_text(weight_source)
    if text is None:
        return PromptCount(tokens=prompt_tokens_bound(prompt, tools), exact=False)
    if isinstance(prompt, str):
        ids = text_token_ids(text.tokenizer, prompt)
        if not ids:
            raise InvalidRequest("prompt: the prompt is empty (no tokens)", param="prompt")
    else:
        try:
            ids = prompt_token_ids(text.tokenizer, prompt, tools)
        except TemplateOverBudget as error:
            raise ChatTemplateOverBudget(
                f"{error.message}: the model's template is at fault (its operator is told)"
            ) from error
        except TemplateRefused as error:
            raise InvalidRequest(error.message) from error
    if text.context_length is not None and len(ids) + max_tokens > text.context_length:
        raise ContextLengthExceeded(
            f"The prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds the "
            f"model's context of {text.context_length} tokens"
        )
    blocks = tuple(block_hashes(prefix_seed, ids)) if prefix_seed else ()
    return PromptCount(tokens=len(ids), exact=True, blocks=blocks)


@lru_cache(maxsize=32)
def _grammar_words(weight_source: str) -> LLTokenizer | None:
    text = model_text(weight_source)
    return None if text is None else grammar_words(text.tokenizer)


def grammar_check(*, weight_source: str, grammar: str | None, param: str) -> None:
    """Refuse a grammar that cannot be followed, as the head would (a 400 naming
    ``param``, ``response_format`` or ``tools``, in the library's words naming the
    construct), against the model's tokenizer when this process has it, so that a
    head's refusal afterwards is the head's fault. Without the tokenizer (then the
    prompt is not counted either) only the grammar itself is checked and the head's
    word stands. Compiling a large schema takes a while, and the tokenizer's grammar
    view is built once per process: call it off the event loop."""
    if grammar is None:
        return
    problem = grammar_problem(grammar, _grammar_words(weight_source))
    if problem:
        raise InvalidRequest(f"{param} cannot be followed: {problem}", param=param)


def echo_check(*, prompt: PromptCount, top_logprobs: int) -> None:
    """Refuse an echo a head would refuse: more than ``ECHO_MAX_SCORES`` logprobs for the
    prompt's tokens and their alternatives (400 ``prompt_too_long``, as the head says)."""
    scores = echo_scores(prompt.tokens, top_logprobs)
    if prompt.exact and scores > ECHO_MAX_SCORES:
        raise InvalidRequest(
            f"prompt: echoing its {prompt.tokens} tokens with {top_logprobs} alternatives each "
            f"is {scores} logprobs; at most {ECHO_MAX_SCORES} are reported",
            code="prompt_too_long",
            param="prompt",
        )


def prompt_tokens_bound(prompt: Prompt, tools: Sequence[Mapping[str, Any]] = ()) -> int:
    """An upper bound of any tokenisation of ``prompt``: raw text (a BOS and such), or
    messages under a chat template, with the tool calls and ``tools`` it renders as JSON
    text (indented, as templates print it). Plans grant hops this many positions (plus
    ``max_tokens``), so it must not fall short of the head's count."""
    if isinstance(prompt, str):
        return len(prompt.encode()) + MESSAGE_ALLOWANCE
    text = sum(len(m["role"].encode()) + len(m["content"].encode()) for m in prompt)
    calls = [[m.get("tool_calls"), m.get("tool_call_id")] for m in prompt]
    rendered = (
        len(json.dumps([calls, list(tools)], indent=4).encode())
        if tools or any(map(any, calls))
        else 0
    )
    return text + rendered + MESSAGE_ALLOWANCE * len(prompt) + TEMPLATE_ALLOWANCE


@lru_cache(maxsize=32)
def model_text(weight_source: str) -> ModelText | None:
    """The tokenizer of the model at ``weight_source``, loaded once per process; None if
    this process cannot load it."""
    try:
        return model_text_load(weight_source)
    except (TokenizerUnavailable, OSError, ValueError) as error:
        logger.warning(
            "no tokenizer for weight source %r here (%s): prompt counts are bounded from "
            "the request body",
            weight_source,
            error,
        )
        return None
