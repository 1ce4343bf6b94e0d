"""The answer shapes, declared once: what a client's ``usage`` says, and the OpenAPI
components the same declarations document (their names are what clients generate from)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.generators import SchemaGenerator

from tracker_app.completions.shapes import (
    ChatCompletionChunk,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionUsage,
    component,
    usage_of,
)


def schema_components() -> dict[str, Any]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return dict(schema["components"]["schemas"])


def test_usage_counts_the_prompt_and_the_completion_and_their_sum() -> None:
    assert usage_of(12, 30) == {
        "prompt_tokens": 12,
        "completion_tokens": 30,
        "total_tokens": 42,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_the_clients_usage_and_logprobs_keep_openais_component_names() -> None:
    components = schema_components()

    assert {"Usage", "TopLogprob", "TokenLogprob", "ChatCompletion"} <= components.keys()
    declared = {CompletionUsage.__name__, ChatTopLogprob.__name__, ChatTokenLogprob.__name__}
    assert not declared & components.keys()


def test_a_shape_is_one_component_however_often_it_is_nested() -> None:
    assert component(ChatCompletionChunk) is component(ChatCompletionChunk)

    components = schema_components()

    usage = "#/components/schemas/Usage"
    assert components["ChatCompletion"]["properties"]["usage"]["$ref"] == usage
    assert components["ChatCompletionChunk"]["properties"]["usage"]["$ref"] == usage
    token = components["TokenLogprob"]["properties"]
    assert token["top_logprobs"]["items"]["$ref"] == "#/components/schemas/TopLogprob"


def test_the_schema_documents_what_a_type_cannot_say() -> None:
    components = schema_components()

    usage = components["Usage"]
    assert set(usage["required"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
    }
    assert usage["properties"]["total_tokens"]["minimum"] == 0
    byte = components["TopLogprob"]["properties"]["bytes"]["items"]
    assert (byte["minimum"], byte["maximum"]) == (0, 255)
    # NotRequired: a chunk carries usage only at the end.
    assert "usage" not in components["ChatCompletionChunk"]["required"]
