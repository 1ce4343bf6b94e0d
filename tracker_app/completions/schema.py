"""The OpenAPI documentation of what the tracker serves outside DRF.

``POST /v1/chat/completions`` and ``POST /v1/completions`` are Channels
consumers (:mod:`tracker_app.completions.consumer`), ``/healthz`` and ``/metrics``
are plain Django views: drf-spectacular cannot see them.
:func:`add_endpoints_outside_drf` (a preprocessing hook) adds a schema-only
view for each, built from the serializers that parse the requests
(:mod:`~tracker_app.completions.chat_request`,
:mod:`~tracker_app.completions.text_request`), the declarations the answers
are built through (:mod:`~tracker_app.completions.shapes`), the parameters
Meshnet refuses, and the limits and error codes the code uses. The views are
never routed. ``tests/tracker/completions/test_schema.py`` validates live
answers of every endpoint against the schema.

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
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_serializer
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
    error_responses,
    security,
)
from nodes_app.protocol.sse import SSE_DONE
from tracker_app.completions.chat_request import ChatCompletionRequest
from tracker_app.completions.parameters import (
    CHOICES_CEILING,
    Refused,
)
from tracker_app.completions.shapes import (
    ChatCompletion,
    ChatCompletionChunk,
    TextCompletion,
    TextCompletionChunk,
    component,
)
from tracker_app.completions.text_request import TextCompletionRequest


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "tracker_app.api_keys.authentication.ApiKeyAuthentication"
    name = API_KEY

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        return SECURITY_SCHEMES[API_KEY]


def refused_parameters(refused: tuple[Refused, ...]) -> str:
    """The parameters an endpoint refuses, as the operation's description lists them."""
    return "; ".join(f"`{r.name}` (accepted: {_neutral_values(r)})" for r in refused)


def _neutral_values(refused: Refused) -> str:
    values = ", ".join(json.dumps(value) for value in refused.neutral)
    if refused.same_as is None:
        return values
    other, _ = refused.same_as
    return f"{values}, or equal to `{other}`"


# --- the answers: the same declarations the answers are built through -------------------

ChatCompletionOutput = component(ChatCompletion)
ChatCompletionChunkOutput = component(ChatCompletionChunk)
TextCompletionOutput = component(TextCompletion)
TextCompletionChunkOutput = component(TextCompletionChunk)


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
        "`param` names it) unless they ask for nothing: "
        f"{refused_parameters(ChatCompletionRequest.refused)}. "
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
        f"{refused_parameters(TextCompletionRequest.refused)}. "
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
                e403="metrics_private (no token is set and the client is not a direct loopback "
                "one: forwarded, behind a declared proxy, or elsewhere)",
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
