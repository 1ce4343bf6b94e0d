"""Structured output: OpenAI's ``response_format`` as the grammar the last hop follows.

``{"type": "json_object"}`` asks for any JSON object, ``{"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}`` for one valid against the schema;
``{"type": "text"}`` (or none) for free text. The tracker compiles the request
into an llguidance grammar (:func:`response_format_grammar`, ADR-0022); before
routing it refuses, with the library's own words naming the construct, a schema
that cannot be followed (``prompt_tokens.grammar_check``); the grammar travels
with the sampling parameters to the last hop, which masks every token that cannot
continue it. The JSON is written compactly
(no free whitespace, which a small model can otherwise repeat until
``max_tokens``). Every schema is enforced, ``strict`` or not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import extend_schema_field
from llguidance import LLMatcher
from rest_framework import serializers

from nodes_app.protocol.sampling import GRAMMAR_MAX_CHARS
from nodes_app.shared.grammar import first_line

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# OpenAI's rule for a schema's name.
SCHEMA_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# How the JSON is laid out: compact, one way (llguidance's JSON options).
JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class UnfollowableFormat(ValueError):
    """The ``response_format`` cannot be followed; the message says why."""


def response_format_grammar(value: Any) -> str | None:
    """The grammar for OpenAI's ``response_format`` ``value`` (None: free text).

    Raises :class:`UnfollowableFormat` for a format that is not one of the three
    types, a ``json_schema`` without a valid ``name`` or with a ``schema`` that is
    not an object, or that is not JSON the library reads, and a grammar larger than a
    node takes. Whether the library can follow the schema is checked later, off the
    event loop (``prompt_tokens.grammar_check``).
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise UnfollowableFormat("must be an object with a 'type'")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return _compiled(ANY_OBJECT)
    if kind != "json_schema":
        raise UnfollowableFormat(
            f"type {str(kind)[:40]!r} is not one of 'text', 'json_object', 'json_schema'"
        )
    spec = value.get("json_schema")
    if not isinstance(spec, Mapping):
        raise UnfollowableFormat("json_schema must be an object with a name and a schema")
    name = spec.get("name")
    if not isinstance(name, str) or not SCHEMA_NAME.fullmatch(name):
        raise UnfollowableFormat("json_schema.name must be 1-64 letters, digits, '_' or '-'")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise UnfollowableFormat("json_schema.strict must be a boolean")
    schema = spec.get("schema", ANY_OBJECT)
    if not isinstance(schema, Mapping):
        raise UnfollowableFormat("json_schema.schema must be a JSON Schema object")
    return _compiled(dict(schema))


def _compiled(schema: dict[str, Any]) -> str:
    loop = ref_loop(schema)
    if loop is not None:
        raise UnfollowableFormat(
            f"the schema cannot be followed: $ref {loop!r} refers only to itself "
            "(no value can match it)"
        )
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    except ValueError as error:
        raise UnfollowableFormat(f"the schema cannot be followed: {first_line(error)}") from None
    return grammar_bounded(grammar, what="the schema")


def ref_loop(schema: Mapping[str, Any]) -> str | None:
    """The first local ``$ref`` of ``schema`` that leads, through schemas that are only a
    ``$ref``, back to itself (no value matches it: the last hop's matcher could never
    start); None when there is none. The schema's size is bounded by the request's."""
    for ref in _local_refs(schema):
        seen: set[str] = set()
        target: str | None = ref
        while target is not None and target not in seen:
            seen.add(target)
            target = _only_ref(_resolved(schema, target))
        if target is not None:
            return target
    return None


def _local_refs(value: Any) -> list[str]:
    refs: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                refs.append(ref)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return refs


def _resolved(schema: Mapping[str, Any], ref: str) -> Any:
    """What the JSON pointer ``ref`` (``#/a/b``) names in ``schema``; None if nothing."""
    node: Any = schema
    for part in ref.removeprefix("#").split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            node = node.get(key)
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _only_ref(node: Any) -> str | None:
    """The local ``$ref`` a schema is and nothing more (annotations aside)."""
    if not isinstance(node, Mapping):
        return None
    ref = node.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    constraining = set(node) - {"$ref", "$defs", "definitions", "title", "description", "$comment"}
    return None if constraining else ref


def grammar_bounded(grammar: str, *, what: str) -> str:
    """``grammar``, if a node takes its size (``what`` names its source in the error);
    raises :class:`UnfollowableFormat` otherwise. Whether it can be followed is checked
    off the event loop, where compiling a large schema cannot stall other requests
    (``prompt_tokens.grammar_check``)."""
    if len(grammar) > GRAMMAR_MAX_CHARS:
        raise UnfollowableFormat(
            f"{what} compiles to {len(grammar)} characters of grammar; at most "
            f"{GRAMMAR_MAX_CHARS} are taken"
        )
    return grammar


@extend_schema_field(
    {
        "type": "object",
        "description": "text (default), json_object (any JSON object) or json_schema "
        "(an answer valid against json_schema.schema); enforced on the last hop",
        "properties": {
            "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
            "json_schema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                    "description": {"type": "string"},
                    "schema": {"type": "object"},
                    "strict": {"type": "boolean", "nullable": True},
                },
                "required": ["name"],
            },
        },
        "required": ["type"],
        "nullable": True,
    }
)
class ResponseFormatField(serializers.JSONField):
    """``response_format``: its internal value is the grammar (None: free text)."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        try:
            return response_format_grammar(value)
        except UnfollowableFormat as error:
            raise serializers.ValidationError(str(error)) from None
