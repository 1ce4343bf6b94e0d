"""Grammars over a model's vocabulary, torch-free: for the tracker, the head and the last hop.

A request's ``response_format`` or ``tools`` becomes an llguidance grammar
(ADR-0022). Whether a grammar can be followed depends on the tokenizer too:
the tracker checks it against the model's tokenizer before routing (as it
counts the prompt), the head again before any hop sees it, and the last hop
compiles it into a matcher. All three read the tokenizer through
:func:`grammar_words`, compile through :func:`grammar_matcher` and judge
through :func:`grammar_problem`, so they agree.

A grammar is judged the way the last hop uses it: compiled into a matcher
and its first mask computed. llguidance's ``validate_grammar`` alone accepts
grammars whose matcher cannot produce a first token (a ``$ref`` that resolves
only to itself fails only at the first mask, ``NoExtensionBias``); such a
grammar reaching the last hop failed the hop, not the request. Every step is
bounded by :data:`GRAMMAR_LIMITS`, llguidance's own work limits, so judging a
hostile grammar costs at most tens of milliseconds of one thread.
"""

from __future__ import annotations

from typing import Any

from llguidance import LLMatcher, LLParserLimits, LLTokenizer
from llguidance.hf import from_tokenizer

# The work a grammar may cost, the library's defaults written down (its documented
# speeds: ~20 ms to build the lexer, ~15 ms per mask at most); verbose errors off,
# since an error's state dump would repeat the client's schema into logs.
GRAMMAR_LIMITS_ARGS: dict[str, Any] = {
    "max_items_in_row": 2000,
    "initial_lexer_fuel": 1_000_000,
    "step_lexer_fuel": 200_000,
    "step_max_items": 50_000,
    "max_lexer_states": 250_000,
    "max_grammar_size": 500_000,
    "verbose_errors": False,
}

# Why a matcher stops before its first token, in words a client can act on.
NO_FIRST_TOKEN = {
    "NoExtension": "no answer can start under it",
    "NoExtensionBias": "no answer can start under it",
}


def grammar_limits() -> LLParserLimits:
    """The work limits every matcher and check of a grammar runs under."""
    return LLParserLimits(**GRAMMAR_LIMITS_ARGS)


def grammar_words(tokenizer: Any) -> LLTokenizer:
    """The llguidance view of a transformers fast tokenizer (0.35 s for SmolLM2's 49,152
    tokens on a 2-vCPU VM: build it once per process and model)."""
    return from_tokenizer(tokenizer)


def grammar_matcher(words: LLTokenizer, grammar: str) -> LLMatcher:
    """A matcher of ``grammar`` over ``words`` under :func:`grammar_limits` (in an error
    state, never raising, when the grammar cannot be followed)."""
    return LLMatcher(words, grammar, log_level=0, limits=grammar_limits())


def grammar_problem(grammar: str, words: LLTokenizer | None = None) -> str:
    """Why ``grammar`` cannot be followed, in the library's words (first line) naming
    the construct; "" when it can.

    With ``words`` (the model's tokenizer) the grammar is judged as the last hop
    uses it: its matcher is built and its first mask computed, so a grammar that
    passes here gives the last hop a first token to choose. Without, only the
    grammar itself is validated.
    """
    problem = first_line(LLMatcher.validate_grammar(grammar, words, limits=grammar_limits()))
    if problem or words is None:
        return problem
    matcher = grammar_matcher(words, grammar)
    if not matcher.is_error():
        matcher.compute_logit_bias()
    if not matcher.is_error():
        return ""
    return matcher_problem(matcher.get_error())


def matcher_problem(error: str) -> str:
    """A matcher's error as a client reads it: the library's first line, and for a
    grammar that admits no first token, that in words (such as a ``$ref`` that only
    refers to itself)."""
    reason = first_line(error) or "unknown error"
    why = NO_FIRST_TOKEN.get(reason)
    if why is None:
        return reason
    return f"{why} ({reason}: a definition that only refers to itself, or admits no value)"


def first_line(message: object) -> str:
    """A library message's first line, shortened: what an error shows of it."""
    lines = str(message).strip().splitlines()
    return lines[0][:300] if lines else ""
