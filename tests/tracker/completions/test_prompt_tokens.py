"""The tracker's own count of a prompt, and what it refuses before routing (a prompt past
the context, an echo with too many scores, a grammar the tokenizer cannot follow), so
that a head's refusal of the same afterwards is the head's fault (ADR-0022)."""

from __future__ import annotations

import pytest
from llguidance import LLMatcher

from meshnet_site.errors import DomainError, http_error
from nodes_app.protocol.limits import ECHO_MAX_SCORES
from tracker_app.completions.prompt_tokens import (
    PromptCount,
    echo_check,
    grammar_check,
    prompt_tokens_bound,
    prompt_tokens_count,
)

TINY_SOURCE = "builtin:tiny-random-llama"  # a 4096-token context
NO_TOKENIZER_HERE = "hub:nobody/nothing"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
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
    grammar_check(weight_source=NO_TOKENIZER_HERE, grammar=PAST_THE_VOCABULARY, param="tools")


def test_a_prompt_the_tracker_can_tokenise_is_counted_exactly_and_billed_so() -> None:
    count = prompt_tokens_count(weight_source=TINY_SOURCE, prompt=MESSAGES, max_tokens=16)

    assert count.exact and count.tokens > 0
    # An honest head reports the same count; the tracker bills its own either way.
    assert count.agrees(count.tokens) and not count.agrees(count.tokens + 1)
    assert count.billable(count.tokens + 100) == count.tokens


def test_without_the_tokenizer_the_count_is_a_bound_and_a_head_is_billed_up_to_it() -> None:
    count = prompt_tokens_count(weight_source=NO_TOKENIZER_HERE, prompt=MESSAGES, max_tokens=16)

    assert count == PromptCount(prompt_tokens_bound(MESSAGES), exact=False)
    assert count.billable(7) == 7 and count.billable(count.tokens + 5) == count.tokens
    assert count.agrees(count.tokens) and not count.agrees(count.tokens + 1)


def test_a_prompt_and_max_tokens_past_the_context_is_a_400_before_routing() -> None:
    with pytest.raises(DomainError) as refused:
        prompt_tokens_count(weight_source=TINY_SOURCE, prompt=MESSAGES, max_tokens=4096)

    answer = http_error(refused.value)
    assert (answer.status, answer.body["error"]["code"]) == (400, "context_length_exceeded")
    assert "4096" in answer.body["error"]["message"]


def test_a_text_prompt_of_no_tokens_is_a_400_naming_the_prompt() -> None:
    with pytest.raises(DomainError) as refused:
        prompt_tokens_count(weight_source=TINY_SOURCE, prompt="", max_tokens=1)

    assert http_error(refused.value).body["error"]["param"] == "prompt"


def test_an_echo_past_the_scores_a_head_reports_is_prompt_too_long() -> None:
    echo_check(prompt=PromptCount(100, True), top_logprobs=5)
    tokens = ECHO_MAX_SCORES  # each with its own score and 5 alternatives: far past it
    echo_check(prompt=PromptCount(tokens, False), top_logprobs=5)  # a bound: the head's word

    with pytest.raises(DomainError) as refused:
        echo_check(prompt=PromptCount(tokens, True), top_logprobs=5)

    answer = http_error(refused.value)
    assert (answer.status, answer.body["error"]["code"]) == (400, "prompt_too_long")


def test_the_bound_covers_every_byte_of_the_messages_and_the_tools_they_render() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]

    plain = prompt_tokens_bound(MESSAGES)
    with_tools = prompt_tokens_bound(MESSAGES, tools)

    assert plain >= len(MESSAGES[0]["content"].encode())
    assert with_tools > plain + len("get_weather")
    assert prompt_tokens_bound("héllo") >= len("héllo".encode())
