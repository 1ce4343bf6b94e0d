"""``response_format`` as the grammar the last hop follows: free text, any JSON object or
one valid against a schema; a format that cannot be followed is refused with why."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshnet_site.errors import DomainError, http_error
from nodes_app.protocol.sampling import GRAMMAR_MAX_CHARS
from tracker_app.completions.chat_request import chat_params_parse
from tracker_app.completions.structured import (
    UnfollowableFormat,
    ref_loop,
    response_format_grammar,
)


def schema_format(schema: dict[str, Any], name: str = "answer") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def test_text_or_no_format_is_free_text() -> None:
    assert response_format_grammar(None) is None
    assert response_format_grammar({"type": "text"}) is None


def test_json_mode_and_a_schema_each_compile_to_a_grammar_of_their_own() -> None:
    capital = {
        "type": "object",
        "properties": {"country": {"type": "string"}, "capital": {"type": "string"}},
        "required": ["country", "capital"],
    }

    any_object = response_format_grammar({"type": "json_object"})
    follows = response_format_grammar(schema_format(capital))

    assert any_object and follows
    assert any_object != follows


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("json", "must be an object"),
        ({"type": "yaml"}, "is not one of 'text', 'json_object', 'json_schema'"),
        ({"type": "json_schema"}, "json_schema must be an object"),
        (schema_format({"type": "object"}, name="two words"), "json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": []}}, "JSON Schema"),
    ],
)
def test_a_format_that_is_not_openais_is_refused_saying_what_is_wrong(
    value: Any, words: str
) -> None:
    with pytest.raises(UnfollowableFormat, match=words):
        response_format_grammar(value)


def test_a_ref_that_only_refers_to_itself_is_refused_as_no_value_can_match_it() -> None:
    schema = {"$ref": "#/$defs/loop", "$defs": {"loop": {"$ref": "#/$defs/loop"}}}

    assert ref_loop(schema) == "#/$defs/loop"
    assert ref_loop({"$ref": "#/$defs/leaf", "$defs": {"leaf": {"type": "string"}}}) is None
    with pytest.raises(UnfollowableFormat, match="refers only to itself"):
        response_format_grammar(schema_format(schema))


def test_a_schema_past_what_a_node_takes_is_refused_by_its_size() -> None:
    properties = {f"field_{i:05d}": {"type": "string"} for i in range(GRAMMAR_MAX_CHARS // 20)}
    schema = {"type": "object", "properties": properties}

    with pytest.raises(UnfollowableFormat, match="characters of grammar"):
        response_format_grammar(
            {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
        )


def test_a_chat_whose_format_cannot_be_followed_is_a_400_naming_response_format() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "yaml"},
    }

    with pytest.raises(DomainError) as refused:
        chat_params_parse(json.dumps(body).encode())

    answer = http_error(refused.value)
    assert (answer.status, answer.body["error"]["param"]) == (400, "response_format")
