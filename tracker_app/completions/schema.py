"""The OpenAPI documentation of what the tracker serves outside DRF.

``POST /v1/chat/completions`` and ``POST /v1/completions`` are Channels
consumers (:mod:`tracker_app.completions.consumer`), ``/healthz`` and ``/metrics``
are plain Django views: drf-spectacular cannot see them.
:func:`add_endpoints_outside_drf` (a preprocessing hook) adds a schema-only
view for each, built from the serializers that parse the requests, the
parameters Meshnet refuses, and the limits and error codes the code uses.
The views are never routed. ``tests/reliability/test_schema.py`` validates
live answers of every endpoint against the schema, so the documentation of
the response bodies here cannot drift unnoticed.

:class:`ApiKeyScheme` tells drf-spectacular how
:class:`~tracker_app.api_keys.authentication.ApiKeyAuthentication` authenticates; it is
registered when this module is imported, which the preprocessing hook's
loading does before any view is inspected.
"""

from __future__ import annotations

import json
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from meshnet_site.api_schema import (
    API_KEY,
    METRICS_TOKEN,
    SECURITY_SCHEMES,
    STAFF_SESSION,
    ErrorBody,
    constant,
    error_responses,
    security,
)
from nodes_app.protocol.limits import MAX_STOP_LENGTH, MAX_STOPS
from nodes_app.protocol.sampling import LOGIT_BIAS_MAX, LOGIT_BIAS_MAX_ENTRIES
from nodes_app.protocol.sse import SSE_DONE
from routing_app.api import HopOutput
from routing_app.choice import DecisionMode

# The parsers' own serializers, private to their modules: the schema documents them.
from tracker_app.completions.chat import _ChatRequest, _Message
from tracker_app.completions.parameters import (
    CHAT_REFUSED,
    CHOICES_CEILING,
    COMPLETIONS_REFUSED,
    LogitBiasField,
    Refused,
)
from tracker_app.completions.text import _CompletionRequest

FINISH_REASONS = ["stop", "length"]


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "tracker_app.api_keys.authentication.ApiKeyAuthentication"
    name = API_KEY

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        return SECURITY_SCHEMES[API_KEY]


# --- the chat request: the consumer's own serializer, its free-form fields described ----

_TEXT_PART = {
    "type": "object",
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_STOP = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH}


@extend_schema_field(
    {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
)
class _MessageContent(serializers.JSONField):
    """``content``: plain text, or OpenAI's list of text parts (joined in order)."""


@extend_schema_field(
    {
        "oneOf": [_STOP, {"type": "array", "items": _STOP, "maxItems": MAX_STOPS}],
        "nullable": True,
    }
)
class _StopSequences(serializers.JSONField):
    """``stop``: one sequence or a list of them."""


@extend_schema_field(
    {
        "type": "object",
        "description": "Token id (decimal) → bias added to its logit",
        "additionalProperties": {
            "type": "number",
            "minimum": -LOGIT_BIAS_MAX,
            "maximum": LOGIT_BIAS_MAX,
        },
        "propertyNames": {"pattern": "^(0|[1-9][0-9]{0,9})$"},
        "maxProperties": LOGIT_BIAS_MAX_ENTRIES,
        "nullable": True,
    }
)
class _LogitBias(LogitBiasField):
    """``logit_bias``: token id → bias."""


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1},
        ],
    }
)
class _TextPrompt(serializers.JSONField):
    """``prompt``: a text, or a list of texts (each its own choices)."""


@extend_schema_serializer(component_name="ChatMessage")
class _DocumentedMessage(_Message):
    content = _MessageContent()


@extend_schema_serializer(component_name="ChatCompletion")
class ChatCompletionRequest(_ChatRequest):
    # What tracker_app.completions.chat.chat_params_parse accepts: every field, range and default
    # is the parser's; only its free-form JSON fields are described here.

    messages = _DocumentedMessage(many=True, allow_empty=False)
    stop = _StopSequences(required=False, default=None, allow_null=True)
    logit_bias = _LogitBias(required=False, allow_null=True)


@extend_schema_serializer(component_name="TextCompletion")
class TextCompletionRequest(_CompletionRequest):
    # What tracker_app.completions.text.text_completion_params_parse accepts.

    prompt = _TextPrompt()
    stop = _StopSequences(required=False, default=None, allow_null=True)
    logit_bias = _LogitBias(required=False, allow_null=True)


def refused_parameters(refused: tuple[Refused, ...]) -> str:
    """The parameters an endpoint refuses, as the operation's description lists them."""
    return "; ".join(f"`{r.name}` (accepted: {_neutral_values(r)})" for r in refused)


def _neutral_values(refused: Refused) -> str:
    values = ", ".join(json.dumps(value) for value in refused.neutral)
    if refused.same_as is None:
        return values
    other, _ = refused.same_as
    return f"{values}, or equal to `{other}`"


# --- the chat answers: chat.completion, its chunks, the meshnet route ----------------


@extend_schema_serializer(component_name="Usage")
class UsageOutput(serializers.Serializer[dict[str, Any]]):
    prompt_tokens = serializers.IntegerField(min_value=0)
    completion_tokens = serializers.IntegerField(min_value=0)
    total_tokens = serializers.IntegerField(min_value=0)


@extend_schema_serializer(component_name="MeshnetRoute")
class MeshnetRouteOutput(serializers.Serializer[dict[str, Any]]):
    """The route serving the request: signature, how it was chosen, its hops."""

    route = serializers.CharField()
    mode = serializers.ChoiceField(choices=[str(mode) for mode in DecisionMode])
    hops = HopOutput(many=True)


@extend_schema_serializer(component_name="AssistantMessage")
class _AssistantMessage(serializers.Serializer[dict[str, Any]]):
    role = constant("assistant")
    content = serializers.CharField()


@extend_schema_serializer(component_name="TopLogprob")
class _TopLogprob(serializers.Serializer[dict[str, Any]]):
    token = serializers.CharField()
    logprob = serializers.FloatField()
    bytes = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=255))


@extend_schema_serializer(component_name="TokenLogprob")
class _TokenLogprob(_TopLogprob):
    top_logprobs = _TopLogprob(many=True)


@extend_schema_serializer(component_name="ChoiceLogprobs")
class _ChoiceLogprobs(serializers.Serializer[dict[str, Any]]):
    """With ``logprobs: true``: each token's log-probability, and its ``top_logprobs``."""

    content = _TokenLogprob(many=True)


@extend_schema_serializer(component_name="ChatChoice")
class _Choice(serializers.Serializer[dict[str, Any]]):
    index = serializers.IntegerField(min_value=0)
    message = _AssistantMessage()
    logprobs = _ChoiceLogprobs(allow_null=True)
    finish_reason = serializers.ChoiceField(choices=FINISH_REASONS)


@extend_schema_serializer(component_name="ChatCompletion")
class ChatCompletionOutput(serializers.Serializer[dict[str, Any]]):
    id = serializers.CharField()
    object = constant("chat.completion")
    created = serializers.IntegerField()
    model = serializers.CharField()
    choices = _Choice(many=True)
    usage = UsageOutput()
    meshnet = MeshnetRouteOutput()


@extend_schema_serializer(component_name="ChatDelta")
class _Delta(serializers.Serializer[dict[str, Any]]):
    # The first delta has the role, the last neither.
    role = constant("assistant", required=False)
    content = serializers.CharField(required=False)


@extend_schema_serializer(component_name="ChatChunkChoice")
class _ChunkChoice(serializers.Serializer[dict[str, Any]]):
    index = serializers.IntegerField(min_value=0)
    delta = _Delta()
    logprobs = _ChoiceLogprobs(required=False, allow_null=True)
    finish_reason = serializers.ChoiceField(choices=FINISH_REASONS, allow_null=True)


@extend_schema_serializer(component_name="ChatCompletionChunk")
class ChatCompletionChunkOutput(serializers.Serializer[dict[str, Any]]):
    """One ``data:`` event of a streamed answer: the first carries ``meshnet``, the last
    ``finish_reason`` and ``usage``."""

    id = serializers.CharField()
    object = constant("chat.completion.chunk")
    created = serializers.IntegerField()
    model = serializers.CharField()
    choices = _ChunkChoice(many=True)
    meshnet = MeshnetRouteOutput(required=False)
    usage = UsageOutput(required=False)


@extend_schema_serializer(component_name="LegacyLogprobs")
class _LegacyLogprobs(serializers.Serializer[dict[str, Any]]):
    """OpenAI's legacy log-probabilities, one entry per token of the choice's text (the
    prompt's first with ``echo``: its first token has none, ``null``)."""

    tokens = serializers.ListField(child=serializers.CharField())
    token_logprobs = serializers.ListField(child=serializers.FloatField(allow_null=True))
    top_logprobs = serializers.ListField(
        child=serializers.DictField(child=serializers.FloatField(), allow_null=True)
    )
    text_offset = serializers.ListField(child=serializers.IntegerField(min_value=0))


@extend_schema_serializer(component_name="TextChoice")
class _TextChoice(serializers.Serializer[dict[str, Any]]):
    text = serializers.CharField(allow_blank=True)
    index = serializers.IntegerField(min_value=0)
    logprobs = _LegacyLogprobs(allow_null=True)
    finish_reason = serializers.ChoiceField(choices=FINISH_REASONS)


@extend_schema_serializer(component_name="TextCompletion")
class TextCompletionOutput(serializers.Serializer[dict[str, Any]]):
    id = serializers.CharField()
    object = constant("text_completion")
    created = serializers.IntegerField()
    model = serializers.CharField()
    choices = _TextChoice(many=True)
    usage = UsageOutput()
    meshnet = MeshnetRouteOutput()


@extend_schema_serializer(component_name="TextChunkChoice")
class _TextChunkChoice(_TextChoice):
    finish_reason = serializers.ChoiceField(choices=FINISH_REASONS, allow_null=True)


@extend_schema_serializer(component_name="TextCompletionChunk")
class TextCompletionChunkOutput(serializers.Serializer[dict[str, Any]]):
    """One ``data:`` event of a streamed legacy answer: the first carries ``meshnet``, the
    last ``finish_reason`` and ``usage``."""

    id = serializers.CharField()
    object = constant("text_completion")
    created = serializers.IntegerField()
    model = serializers.CharField()
    choices = _TextChunkChoice(many=True)
    meshnet = MeshnetRouteOutput(required=False)
    usage = UsageOutput(required=False)


EVENT_STREAM = "text/event-stream"


def _stream_description(chunk: str) -> str:
    return (
        f"With `stream: true`: server-sent events, each `data: <JSON>`: {chunk} events, the "
        "first with `meshnet`, each choice's last with its `finish_reason`, the very last "
        "with `usage` too; a failure after the stream began ends it with an Error event "
        f"instead. The stream ends with `data: {SSE_DONE}`."
    )


class _ChatCompletionsSchema(AutoSchema):
    """Describes each event of the stream (the schema of an event-stream media type, as
    OpenAPI before 3.2 reads it): its ``data`` is a chunk or an error as JSON, or the
    closing ``[DONE]``. A list the parser refuses empty (``allow_empty=False``, which
    drf-spectacular does not read) gets its ``minItems``."""

    chunk: type[serializers.Serializer[dict[str, Any]]] = ChatCompletionChunkOutput

    def _map_serializer_field(
        self, field: Any, direction: str, bypass_extensions: bool = False
    ) -> dict[str, Any]:
        schema: dict[str, Any] = super()._map_serializer_field(field, direction, bypass_extensions)
        if getattr(field, "allow_empty", True) is False and schema.get("type") == "array":
            schema["minItems"] = max(1, schema.get("minItems", 0))
        return schema

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        chunk = self.resolve_serializer(self.chunk, "response").ref
        error = self.resolve_serializer(ErrorBody, "response").ref
        operation["responses"]["200"]["content"][EVENT_STREAM]["schema"] = {
            "type": "object",
            "description": _stream_description(self.chunk.__name__.removesuffix("Output")),
            "properties": {
                "data": {
                    "anyOf": [
                        {"const": SSE_DONE},
                        {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "contentSchema": {"oneOf": [chunk, error]},
                        },
                    ]
                }
            },
            "required": ["data"],
        }
        return operation


def completion_errors(**more: str) -> dict[int, OpenApiResponse]:
    """The error statuses both completion endpoints answer (``more``: an endpoint's own)."""
    return error_responses(
        e400="invalid_request, invalid_json, unsupported_parameter, "
        "context_length_exceeded, invalid_route, or a node's refusal of the request "
        "(its code)",
        e401="invalid_api_key",
        e404="model_not_found",
        e411="length_required",
        e413="request_too_large",
        e429="rate_limit_exceeded",
        e500="internal_error",
        e502="upstream_failed",
        e503="no_route, route_node_unavailable, route_busy",
        **more,
    )


class ChatCompletionsSchemaView(APIView):
    """Documentation only: the consumer serves ``POST /v1/chat/completions``."""

    schema = _ChatCompletionsSchema()

    @extend_schema(
        operation_id="chat_completions_create",
        summary="OpenAI-compatible chat completion",
        description="Served by a Channels consumer that streams without buffering. "
        "Authenticated by an API key, or by a staff member's dashboard session "
        "(then with the page's CSRF token and origin). `n` choices (at most "
        f"MESHNET_MAX_CHOICES, {CHOICES_CEILING} in any deployment) run at once. OpenAI "
        "parameters Meshnet does not honour are refused (400 `unsupported_parameter`, "
        f"`param` names it) unless they ask for nothing: {refused_parameters(CHAT_REFUSED)}. "
        "Other fields are ignored.",
        auth=security(API_KEY, STAFF_SESSION),
        request={"application/json": ChatCompletionRequest},
        responses={
            (200, "application/json"): OpenApiResponse(
                ChatCompletionOutput,
                description="The answer: whole (`stream: false`) or streamed (`stream: true`)",
            ),
            # Its schema is the event's: see _ChatCompletionsSchema.
            (200, EVENT_STREAM): OpenApiResponse(OpenApiTypes.OBJECT),
            **completion_errors(e403="csrf_failed, dashboard_key_revoked (dashboard sessions)"),
        },
    )
    def post(self, request: Request) -> Response:
        raise NotImplementedError("documentation only")


class _TextCompletionsSchema(_ChatCompletionsSchema):
    chunk = TextCompletionChunkOutput


class TextCompletionsSchemaView(APIView):
    """Documentation only: the consumer serves ``POST /v1/completions``."""

    schema = _TextCompletionsSchema()

    @extend_schema(
        operation_id="completions_create",
        summary="OpenAI-compatible legacy text completion",
        description="A raw text prompt (no chat template), or a list of them, each its own "
        "`n` choices (prompts × n at most MESHNET_MAX_CHOICES). `echo` gives the prompt "
        "back before the completion, with its tokens' log-probabilities when `logprobs` "
        "(0-5 alternatives) is set; `max_tokens: 0` with `echo` scores the prompt without "
        "generating. Unsupported OpenAI parameters are refused (400 "
        f"`unsupported_parameter`) unless they ask for nothing: "
        f"{refused_parameters(COMPLETIONS_REFUSED)}. "
        "Other fields are ignored.",
        auth=security(API_KEY),
        request={"application/json": TextCompletionRequest},
        responses={
            (200, "application/json"): OpenApiResponse(
                TextCompletionOutput,
                description="The answer: whole (`stream: false`) or streamed (`stream: true`)",
            ),
            # Its schema is the event's: see _ChatCompletionsSchema.
            (200, EVENT_STREAM): OpenApiResponse(OpenApiTypes.OBJECT),
            **completion_errors(),
        },
    )
    def post(self, request: Request) -> Response:
        raise NotImplementedError("documentation only")


# --- health and metrics: plain Django views ------------------------------------------


@extend_schema_serializer(component_name="Health")
class HealthOutput(serializers.Serializer[dict[str, Any]]):
    status = serializers.ChoiceField(choices=["ok", "unavailable"])
    database = serializers.ChoiceField(choices=["ok", "unavailable"])


class HealthSchemaView(APIView):
    """Documentation only: :func:`tracker_app.views.healthz` serves ``GET /healthz``."""

    @extend_schema(
        operation_id="healthz",
        auth=[],
        responses={
            200: OpenApiResponse(HealthOutput, description="The database answers"),
            503: OpenApiResponse(HealthOutput, description="The database does not answer"),
        },
    )
    def get(self, request: Request) -> Response:
        raise NotImplementedError("documentation only")


class MetricsSchemaView(APIView):
    """Documentation only: :func:`tracker_app.views.metrics` serves ``GET /metrics``."""

    @extend_schema(
        operation_id="metrics",
        auth=security(METRICS_TOKEN, None),
        responses={
            (200, "text/plain"): OpenApiResponse(
                OpenApiTypes.STR, description="Prometheus text exposition format"
            ),
            **error_responses(
                e401="invalid_metrics_token (a token is set and another was sent)",
                e403="metrics_private (no token is set and the client is not on a private network)",
            ),
        },
    )
    def get(self, request: Request) -> Response:
        raise NotImplementedError("documentation only")


# (path, path regex, method, view) as drf-spectacular enumerates URL patterns.
OUTSIDE_DRF = [
    ("/v1/chat/completions", "v1/chat/completions", "POST", ChatCompletionsSchemaView.as_view()),
    ("/v1/completions", "v1/completions", "POST", TextCompletionsSchemaView.as_view()),
    ("/healthz", "healthz", "GET", HealthSchemaView.as_view()),
    ("/metrics", "metrics", "GET", MetricsSchemaView.as_view()),
]


def add_endpoints_outside_drf(endpoints: list[Any], **kwargs: Any) -> list[Any]:
    """drf-spectacular preprocessing hook: the documented endpoints DRF does not serve."""
    return [*endpoints, *OUTSIDE_DRF]
