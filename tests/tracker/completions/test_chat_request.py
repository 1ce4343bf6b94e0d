"""What the chat endpoint accepts, and how it explains what it refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshnet_site.errors import DomainError, http_error
from tracker_app.completions.chat_request import CHAT_DEFAULT_MAX_TOKENS, chat_params_parse


def parse(**body: Any) -> Any:
    base: dict[str, Any] = {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": "hi"}],
    }
    return chat_params_parse(json.dumps({**base, **body}).encode())


def refused(body: bytes) -> DomainError:
    with pytest.raises(DomainError) as caught:
        chat_params_parse(body)
    assert http_error(caught.value).status == 400
    return caught.value


def test_it_accepts_a_minimal_request_with_openai_defaults() -> None:
    params = parse()

    assert params.prompts == ([{"role": "user", "content": "hi"}],)
    assert (params.stream, params.max_tokens, params.temperature) == (
        False,
        CHAT_DEFAULT_MAX_TOKENS,
        1.0,
    )
    assert params.stop == [] and params.route is None


def test_it_joins_text_parts_and_takes_max_completion_tokens() -> None:
    params = parse(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
        max_completion_tokens=7,
        stop="\n",
        route=["n1", "n2"],
    )

    assert params.prompts[0][0]["content"] == "ab"
    assert params.max_tokens == 7
    assert params.stop == ["\n"]
    assert params.route == ["n1", "n2"]


def test_bad_json_is_refused_as_invalid_json() -> None:
    assert refused(b"{nope").code == "invalid_json"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model: This field is required"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "content"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3},
            "temperature",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 5}, "n:"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}, "n:"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            "max_tokens",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 5}, "stop"),
    ],
)
def test_bad_fields_are_refused_naming_the_field(body: dict[str, Any], words: str) -> None:
    error = refused(json.dumps(body).encode())

    assert error.code == "invalid_request"
    assert words in error.message


def test_a_body_that_is_not_an_object_is_refused() -> None:
    assert "JSON object" in refused(b"[1, 2]").message
