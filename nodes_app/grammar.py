"""Grammars over a model's vocabulary, torch-free: for the tracker, the head and the last hop.

A request's ``response_format`` or ``tools`` becomes an llguidance grammar
(ADR-0022). Whether a grammar can be followed depends on the tokenizer too:
the tracker checks it against the model's tokenizer before routing (as it
counts the prompt), the head again before any hop sees it, and the last hop
compiles it into a matcher. All three read the tokenizer through
:func:`grammar_words` and the check through :func:`grammar_problem`, so they
agree.
"""

from __future__ import annotations

from typing import Any

from llguidance import LLMatcher, LLTokenizer
from llguidance.hf import from_tokenizer


def grammar_words(tokenizer: Any) -> LLTokenizer:
    """The llguidance view of a transformers fast tokenizer (0.35 s for SmolLM2's 49,152
    tokens on a 2-vCPU VM: build it once per process and model)."""
    return from_tokenizer(tokenizer)


def grammar_problem(grammar: str, words: LLTokenizer | None = None) -> str:
    """Why ``grammar`` cannot be followed (with ``words``, the model's tokenizer, when
    given), in the library's words, first line; "" when it can."""
    return first_line(LLMatcher.validate_grammar(grammar, words))


def first_line(message: object) -> str:
    """A library message's first line, shortened: what an error shows of it."""
    lines = str(message).strip().splitlines()
    return lines[0][:300] if lines else ""
