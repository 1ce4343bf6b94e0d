"""Drafts without a model: prompt lookup (what followed the latest earlier occurrence of the
text's end) and what a structured output's grammar forces."""

from __future__ import annotations

from typing import Any

import pytest

from nodes_app.runtime.head.drafts import GrammarForced, PromptLookup
from nodes_app.shared.grammar import grammar_matcher, grammar_words
from nodes_app.shared.tokenization import tiny_tokenizer
from tracker_app.completions.structured import response_format_grammar


def test_it_proposes_what_followed_the_longest_suffix_seen_before() -> None:
    # "3 4" occurred twice: its latest occurrence, followed by 9, wins over "4" alone
    # (latest followed by 6).
    lookup = PromptLookup([2, 3, 4, 5, 6, 1, 3, 4, 9, 8, 7, 4, 6, 3, 4])

    assert lookup.propose(3) == [9, 8, 7]


def test_it_proposes_at_most_the_limit_and_nothing_for_a_limit_of_zero() -> None:
    lookup = PromptLookup([5, 6, 7, 8, 9, 5])

    assert lookup.propose(2) == [6, 7]
    assert lookup.propose(0) == []


def test_it_proposes_nothing_when_the_end_never_occurred_before() -> None:
    assert PromptLookup([1, 2, 3, 4]).propose(4) == []
    assert PromptLookup().propose(4) == []


def test_tokens_added_later_are_looked_up_too() -> None:
    lookup = PromptLookup([10, 11, 12])
    lookup.extend([13, 10, 11])

    assert lookup.propose(4) == [12, 13, 10, 11]


def test_it_never_proposes_a_stop_id_nor_what_follows_one() -> None:
    lookup = PromptLookup([1, 2, 0, 3, 1], stop_ids=[0])

    assert lookup.propose(4) == [2]


def test_a_match_with_only_a_stop_id_after_it_falls_back_to_a_shorter_one() -> None:
    # "1 2 8" and "2 8" were followed by the stop id; "8" last by 4.
    lookup = PromptLookup([1, 2, 8, 0, 9, 8, 4, 1, 2, 8], stop_ids=[0])

    assert lookup.propose(2) == [4, 1]


def test_ngram_lengths_must_be_ordered() -> None:
    with pytest.raises(ValueError):
        PromptLookup(shortest=3, longest=2)


def forced(schema: dict[str, object]) -> tuple[GrammarForced, Any]:
    tokenizer = tiny_tokenizer()
    grammar = response_format_grammar(
        {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    )
    assert grammar is not None
    matcher = grammar_matcher(grammar_words(tokenizer), grammar)
    return GrammarForced(matcher, stop_ids=[tokenizer.eos_token_id]), tokenizer


KEYED = {
    "type": "object",
    "properties": {"capital": {"type": "string"}},
    "required": ["capital"],
    "additionalProperties": False,
}


def test_a_grammar_proposes_the_tokens_it_forces_and_follows_the_answer() -> None:
    drafts, tokenizer = forced(KEYED)

    opening = drafts.propose(64)
    assert tokenizer.decode(opening).replace(" ", "").startswith('{"capital":"')
    assert drafts.propose(2) == opening[:2]

    drafts.extend(opening)
    drafts.extend(tokenizer.encode("Paris", add_special_tokens=False))
    assert drafts.propose(8) == []  # the string may go on or close: nothing forced
    drafts.extend(tokenizer.encode('"', add_special_tokens=False))
    assert tokenizer.decode(drafts.propose(8)).strip() == "}"


def test_a_grammar_in_error_proposes_nothing() -> None:
    drafts, tokenizer = forced(KEYED)

    drafts.extend(tokenizer.encode("not json", add_special_tokens=False))

    assert drafts.propose(8) == []
