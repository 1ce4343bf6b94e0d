"""How a request's tools reach a model that only writes text: the generic prompt, the
earlier turns in the same words, the calls object's schema and reading it back; and for
a template that renders tool calls itself, the turns whole and its ``<tool_call>`` blocks."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonschema
import pytest
from llguidance import LLMatcher

from nodes_app.shared.grammar import grammar_words
from nodes_app.shared.tokenization import tiny_tokenizer
from tracker_app.completions.tools import (
    AnswerCalls,
    ToolUse,
    UnusableTools,
    calls_of,
    conversation,
    native_conversation,
    tool_use_parse,
)

WEATHER = {"type": "function", "function": {"name": "weather", "description": "Forecast."}}
TIME = {"type": "function", "function": {"name": "time", "parameters": {"type": "object"}}}


def use(**fields: Any) -> ToolUse:
    parsed = tool_use_parse(
        fields.get("tools", [WEATHER, TIME]),
        fields.get("tool_choice"),
        fields.get("parallel_tool_calls"),
    )
    assert parsed is not None
    return parsed


def test_no_tools_or_tool_choice_none_asks_for_no_calls() -> None:
    assert tool_use_parse(None, None, None) is None
    assert tool_use_parse([], "auto", False) is None
    assert tool_use_parse([WEATHER], "none", None) is None


def test_the_tools_open_the_system_message_or_become_one() -> None:
    asked = [{"role": "user", "content": "Rain?"}]
    with_system = [{"role": "system", "content": "Be brief."}, *asked]

    alone = conversation(asked, use())
    merged = conversation(with_system, use())

    assert alone[0]["role"] == "system" and alone[1:] == asked
    assert "weather: Forecast." in alone[0]["content"]
    assert merged[0]["content"].startswith("Be brief.\n\n") and len(merged) == 2


def test_earlier_calls_and_their_results_are_written_as_the_model_writes_them() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Rain in Oslo and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "tool", "tool_call_id": "c2", "content": "sun"},
    ]

    turns = conversation(history, None)

    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert json.loads(turns[1]["content"]) == {
        "tool_calls": [
            {"name": "weather", "arguments": {"city": "Oslo"}},
            {"name": "weather", "arguments": {"city": "Rome"}},
        ]
    }
    assert turns[2]["content"] == (
        "Result of weather (call c1): rain\nResult of weather (call c2): sun"
    )


@pytest.mark.parametrize(
    ("fields", "calls", "valid"),
    [
        ({}, [("weather", {}), ("time", {})], True),
        ({"parallel_tool_calls": False}, [("weather", {}), ("time", {})], False),
        (
            {"tool_choice": {"type": "function", "function": {"name": "time"}}},
            [("weather", {})],
            False,
        ),
        ({}, [("elsewhere", {})], False),
        ({}, [], False),
    ],
)
def test_the_calls_object_admits_what_tool_choice_and_parallel_calls_allow(
    fields: dict[str, Any], calls: list[tuple[str, Any]], valid: bool
) -> None:
    answer = {"tool_calls": [{"name": name, "arguments": args} for name, args in calls]}
    schema = use(**fields).calls_schema()
    schema.pop("x-guidance")

    if valid:
        jsonschema.validate(answer, schema)
    else:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(answer, schema)


def test_an_answer_is_read_back_as_openai_tool_calls_or_left_as_text() -> None:
    generic = use()
    answer = '{"tool_calls":[{"name":"weather","arguments":{"city":"Oslo"}}]}'

    made = calls_of(answer, generic)

    assert made is not None and made.whole
    [call] = made.calls
    assert call["function"] == {"name": "weather", "arguments": '{"city":"Oslo"}'}
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert calls_of("It rains.", generic) is None


@pytest.mark.parametrize(
    ("answer", "complete"),
    [
        ('{"tool_calls":[{"name":"wea', []),
        ('{"tool_c', []),
        ('{"tool_calls":[{"name":"time","arguments":{"zone":1}}', [("time", '{"zone":1}')]),
        (
            '{"tool_calls":[{"name":"time","arguments":{"zone":1}},'
            '{"name":"weather","arguments":{"city":"Oslo"}},{"name":"weather","argu',
            [("time", '{"zone":1}'), ("weather", '{"city":"Oslo"}')],
        ),
        (
            '{"tool_calls":[{"name":"time","arguments":{"note":"a \\"}, quoted"}},{"na',
            [("time", '{"note":"a \\"}, quoted"}')],
        ),
    ],
)
def test_an_answer_cut_short_keeps_the_calls_it_completed(
    answer: str, complete: list[tuple[str, str]]
) -> None:
    made = calls_of(answer, use())

    assert made is not None and not made.whole
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in made.calls] == complete


def native(**fields: Any) -> ToolUse:
    return dataclasses.replace(use(**fields), native=True)


def test_a_native_answer_is_read_back_from_its_tool_call_blocks() -> None:
    answer = (
        '<tool_call>\n{"name":"weather","arguments":{"city":"Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name":"time","arguments":{}}\n</tool_call>'
    )

    made = calls_of(answer, native())

    assert made is not None and made.whole
    assert [c["function"] for c in made.calls] == [
        {"name": "weather", "arguments": '{"city":"Oslo"}'},
        {"name": "time", "arguments": "{}"},
    ]
    assert calls_of("It rains.", native()) is None
    cut = calls_of(answer + '\n<tool_call>\n{"name":"wea', native())
    assert cut is not None and not cut.whole and len(cut.calls) == 2
    assert calls_of('<tool_call>\n{"name":"wea', native()) == AnswerCalls((), whole=False)


def follows(grammar: str, text: str) -> bool:
    """Whether ``text``, tokenised by the tiny model's byte tokenizer, is a whole answer
    ``grammar`` admits."""
    tokenizer = tiny_tokenizer()
    matcher = LLMatcher(grammar_words(tokenizer), grammar)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return matcher.consume_tokens(ids) and matcher.is_accepting()


@pytest.mark.parametrize(
    ("fields", "answer", "valid"),
    [
        ({}, '<tool_call>\n{"name":"time","arguments":{}}\n</tool_call>', True),
        (
            {},
            '<tool_call>\n{"name":"time","arguments":{}}\n</tool_call>\n'
            '<tool_call>\n{"name":"weather","arguments":{}}\n</tool_call>',
            True,
        ),
        (
            {"parallel_tool_calls": False},
            '<tool_call>\n{"name":"time","arguments":{}}\n</tool_call>\n'
            '<tool_call>\n{"name":"weather","arguments":{}}\n</tool_call>',
            False,
        ),
        ({}, '<tool_call>\n{"name":"elsewhere","arguments":{}}\n</tool_call>', False),
        ({}, "It rains.", False),
        ({"tool_choice": "auto"}, "It rains.", True),
        ({"tool_choice": "auto"}, "<b>It rains.</b>", False),
    ],
)
def test_the_native_grammar_admits_the_blocks_tool_choice_and_parallel_calls_allow(
    fields: dict[str, Any], answer: str, valid: bool
) -> None:
    grammar = native(**{"tool_choice": "required", **fields}).grammar

    assert follows(grammar, answer) is valid


def test_earlier_calls_go_to_a_template_that_renders_them_as_names_and_argument_objects() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Rain in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]

    turns = native_conversation(history)

    assert turns == [
        {"role": "user", "content": "Rain in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
            ],
        },
        {"role": "tool", "content": "rain", "tool_call_id": "c1"},
    ]


@pytest.mark.parametrize(
    ("tools", "tool_choice", "param"),
    [
        ({"type": "function"}, None, "tools"),
        ([{"type": "retrieval"}], None, "tools"),
        ([WEATHER, WEATHER], None, "tools"),
        ([WEATHER], "sometimes", "tool_choice"),
        ([WEATHER], {"type": "function", "function": {"name": "time"}}, "tool_choice"),
    ],
)
def test_tools_that_cannot_be_used_name_the_parameter(
    tools: Any, tool_choice: Any, param: str
) -> None:
    with pytest.raises(UnusableTools) as refused:
        tool_use_parse(tools, tool_choice, None)

    assert refused.value.param == param
