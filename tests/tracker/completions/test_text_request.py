"""The legacy text completion's request: OpenAI's defaults, a list of prompts as choices
each, ``logprobs`` as the top-k, and what it cannot serve refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshnet_site.errors import DomainError, http_error
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.text_request import (
    TEXT_DEFAULT_MAX_TOKENS,
    text_completion_params_parse,
)

TEXT = {"model": "tiny-random-llama", "prompt": "Once upon a time"}


def text(**fields: Any) -> GenerationParams:
    return text_completion_params_parse(json.dumps({**TEXT, **fields}).encode())


def refusal(**fields: Any) -> dict[str, Any]:
    """The error body a client gets for ``fields`` (a 400)."""
    with pytest.raises(DomainError) as caught:
        text(**fields)
    answer = http_error(caught.value)
    assert answer.status == 400
    return dict(answer.body["error"])


def test_a_text_completion_takes_openais_legacy_defaults() -> None:
    params = text()

    assert params.prompts == ("Once upon a time",)
    assert params.max_tokens == TEXT_DEFAULT_MAX_TOKENS == 16
    assert (params.echo, params.logprobs, params.top_logprobs, params.n) == (False, False, 0, 1)


def test_a_list_of_prompts_is_one_choice_each_and_logprobs_is_the_top_k() -> None:
    params = text(prompt=["one", "two", "three"], logprobs=5, echo=True, max_tokens=0)

    assert params.prompts == ("one", "two", "three")
    assert params.choices == 3
    assert (params.logprobs, params.top_logprobs, params.echo, params.max_tokens) == (
        True,
        5,
        True,
        0,
    )
    assert text(logprobs=0).logprobs is True


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"prompt": [1, 2, 3]}, "prompt", "token ids"),
        ({"prompt": [[1, 2]]}, "prompt", "token ids"),
        ({"prompt": []}, "prompt", "non-empty"),
        ({"prompt": None}, "prompt", "null"),
        ({"max_tokens": 0}, "max_tokens", "echo"),
        ({"logprobs": 6}, "logprobs", "5"),
        ({"logprobs": True}, "logprobs", "integer"),
        ({"prompt": ["a", "b", "c"], "n": 2}, "n", "6 choices"),
    ],
)
def test_a_text_completion_refuses_what_it_cannot_serve_naming_the_field(
    fields: dict[str, Any], param: str, words: str
) -> None:
    error = refusal(**fields)

    assert error["param"] == param
    assert words in error["message"]
