"""The request of OpenAI's legacy text completions (``POST /v1/completions``).

What evaluation harnesses use (lm-evaluation-harness's ``local-completions``):
a raw text ``prompt`` (a string, or a list of them: each its own choices) with
no chat template, ``echo`` to get the prompt back with its own token
log-probabilities, ``max_tokens: 0`` with ``echo`` to score a text without
generating. :class:`TextCompletionRequest` is the one declaration of the body (it
validates it; the OpenAPI schema documents it);
:func:`text_completion_params_parse` reads a body into
:class:`~tracker_app.completions.parameters.GenerationParams` (the same as a
chat's, run by the same proxy).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from tracker_app.completions.parameters import (
    CHOICES_CEILING,
    COMPLETIONS_REFUSED,
    DEFAULT_MAX_CHOICES,
    MAX_MAX_TOKENS,
    GenerationFields,
    GenerationParams,
    fields_validate,
    generation_params,
    request_fields,
)

# OpenAI's legacy defaults and limits: 16 tokens, the 5 most likely tokens at most.
TEXT_DEFAULT_MAX_TOKENS = 16
LOGPROBS_MAX = 5


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1},
        ],
    }
)
class TextPrompt(serializers.JSONField):
    """``prompt``: a text, or a list of texts (each its own choices)."""


@extend_schema_serializer(component_name="TextCompletion")
class TextCompletionRequest(GenerationFields):
    refused = COMPLETIONS_REFUSED
    # What :func:`text_completion_params_parse` accepts: every field, range and default.

    prompt = TextPrompt()
    max_tokens = serializers.IntegerField(
        min_value=0, max_value=MAX_MAX_TOKENS, required=False, allow_null=True
    )
    echo = serializers.BooleanField(required=False, allow_null=True)
    logprobs = serializers.IntegerField(
        min_value=0, max_value=LOGPROBS_MAX, required=False, allow_null=True
    )

    def validate_prompt(self, value: Any) -> list[str]:
        """A string, or a list of 1 or more strings; token ids are not taken."""
        prompts = [value] if isinstance(value, str) else value
        if not isinstance(prompts, list) or not prompts:
            raise serializers.ValidationError("must be a string or a non-empty list of strings")
        if not all(isinstance(prompt, str) for prompt in prompts):
            raise serializers.ValidationError(
                "must be text: a string or a list of strings (prompts as token ids are not "
                "supported)"
            )
        if len(prompts) > CHOICES_CEILING:
            raise serializers.ValidationError(f"takes at most {CHOICES_CEILING} prompts")
        return prompts

    def prompts_in(self, attrs: dict[str, Any]) -> int:
        return len(attrs["prompt"])

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("max_tokens") == 0 and not attrs.get("echo"):
            raise serializers.ValidationError(
                {"max_tokens": "may be 0 only with echo: true (to score the prompt alone)"}
            )
        return super().validate(attrs)


def text_completion_params_parse(
    body: bytes, *, max_choices: int = DEFAULT_MAX_CHOICES
) -> GenerationParams:
    """Validate a raw legacy completion body:
    :class:`~tracker_app.completions.parameters.InvalidRequest` names every bad field,
    :class:`~tracker_app.completions.parameters.UnsupportedParameter` every
    OpenAI parameter Meshnet does not honour. ``max_choices``: MESHNET_MAX_CHOICES."""
    raw = request_fields(body)
    v = fields_validate(TextCompletionRequest(data=raw, context={"max_choices": max_choices}))
    max_tokens = v.get("max_tokens")
    logprobs = v.get("logprobs")
    return generation_params(
        v,
        prompts=tuple(v["prompt"]),
        max_tokens=TEXT_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        echo=bool(v.get("echo")),
    )
