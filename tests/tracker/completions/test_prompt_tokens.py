"""What the tracker refuses of a grammar before routing, so that a head's refusal of one
afterwards is the head's fault (ADR-0022)."""

from __future__ import annotations

import pytest
from llguidance import LLMatcher

from meshnet_site.errors import DomainError, http_error
from nodes_app.protocol.sampling import GRAMMAR_MAX_CHARS
from tracker_app.completions.prompt_tokens import grammar_check
from tracker_app.completions.structured import UnfollowableFormat, response_format_grammar

TINY_SOURCE = "builtin:tiny-random-llama"
# Valid as a grammar, but no vocabulary of 259 tokens has token 99999.
PAST_THE_VOCABULARY = LLMatcher.grammar_from_lark("start: <[99999]>")


def test_a_grammar_the_models_tokenizer_cannot_follow_is_a_400_naming_the_parameter() -> None:
    with pytest.raises(DomainError) as refused:
        grammar_check(weight_source=TINY_SOURCE, grammar=PAST_THE_VOCABULARY, param="tools")

    answer = http_error(refused.value)
    assert answer.status == 400
    assert answer.body["error"]["param"] == "tools"
    assert "99999" in answer.body["error"]["message"]


def test_without_the_models_tokenizer_here_the_heads_word_stands() -> None:
    grammar_check(weight_source="hub:nobody/nothing", grammar=PAST_THE_VOCABULARY, param="tools")


def test_a_schema_past_what_a_node_takes_is_refused_by_its_size() -> None:
    properties = {f"field_{i:05d}": {"type": "string"} for i in range(GRAMMAR_MAX_CHARS // 20)}
    schema = {"type": "object", "properties": properties}

    with pytest.raises(UnfollowableFormat, match="characters of grammar"):
        response_format_grammar(
            {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
        )
