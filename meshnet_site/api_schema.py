"""What the OpenAPI schema says about errors and credentials, for every app's endpoints.

Every error reaches a client as ``{"error": {"message", "type", "code"}}``
(and ``param`` when it names a request field; :mod:`meshnet_site.errors`);
:class:`ErrorBody` is that body, and :func:`error_responses` documents the
statuses an operation really answers with it. The security schemes are the
credentials the code really checks: a client's API key and a node's token
(both ``Authorization: Bearer``), the metrics token, and a staff member's
session cookie (DRF's own ``cookieAuth``).
A registration carries no credential: its body is signed by the node's wallet.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from meshnet_site.errors import HTTP_STATUS

# The OpenAI error types the tracker answers with, in the schema's enum.
ERROR_TYPES = sorted({error_type for _, error_type in HTTP_STATUS.values()})

# Security scheme names (``components.securitySchemes``), used in ``extend_schema(auth=…)``.
API_KEY = "apiKey"
NODE_TOKEN = "nodeToken"
METRICS_TOKEN = "metricsToken"
STAFF_SESSION = "cookieAuth"

SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    API_KEY: {
        "type": "http",
        "scheme": "bearer",
        "description": "A client's API key: 'Authorization: Bearer <key>'.",
    },
    NODE_TOKEN: {
        "type": "http",
        "scheme": "bearer",
        "description": "The node token a registration answered with: "
        "'Authorization: Bearer <node token>'.",
    },
    METRICS_TOKEN: {
        "type": "http",
        "scheme": "bearer",
        "description": "MESHNET_METRICS_TOKEN, when set; without one, metrics are served "
        "to a direct loopback client only (no forwarding header, no proxy declared).",
    },
}


def constant(value: str, **kwargs: Any) -> serializers.CharField:
    """A string field that always holds ``value`` (OpenAI's ``"object": "list"``…): a
    one-value enum in the schema, without a named enum component of its own."""

    @extend_schema_field({"type": "string", "enum": [value]})
    class Constant(serializers.CharField):
        pass

    return Constant(**kwargs)


def security(*alternatives: str | None) -> Any:
    """``extend_schema(auth=…)``: any one of these schemes admits the caller (``None``: no
    credential at all). Typed ``Any`` as drf-spectacular's hint says strings where it
    takes, and copies verbatim, OpenAPI security requirements."""
    return [{} if scheme is None else {scheme: []} for scheme in alternatives]


class ErrorDetail(serializers.Serializer[dict[str, Any]]):
    message = serializers.CharField(help_text="For people")
    type = serializers.ChoiceField(choices=ERROR_TYPES, help_text="OpenAI's error type")
    code = serializers.CharField(help_text="Machine-readable, e.g. invalid_api_key")
    param = serializers.CharField(
        required=False, help_text="The request field at fault, when the error names one"
    )


@extend_schema_serializer(component_name="Error")
class ErrorBody(serializers.Serializer[dict[str, Any]]):
    """Every error the tracker answers with, from any endpoint."""

    error = ErrorDetail()


# What each status means wherever it appears; an operation adds its own codes.
_MEANING = {
    400: "The request is invalid",
    401: "Missing or wrong credentials",
    403: "The credentials may not do this",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    411: "A body without Content-Length (chunked) is refused on its headers",
    413: "The body is larger than MESHNET_MAX_REQUEST_BYTES",
    415: "The body's Content-Type is not one this endpoint reads",
    429: "Too many requests; Retry-After says when to try again",
    500: "The tracker failed",
    502: "A node failed",
    503: "Unavailable now",
}

# Every request with a body may be refused on its headers before it is read
# (meshnet_site.asgi_limits); a DRF view also refuses a body it cannot parse.
BODY_REFUSALS = {
    400: "invalid_json: the body is not JSON",
    411: "length_required",
    413: "request_too_large",
    415: "unsupported_media_type",
}


def error_responses(**codes: str) -> dict[int, OpenApiResponse]:
    """The error statuses of one operation, e.g. ``error_responses(e401="invalid_api_key")``:
    each ``e<status>`` names the codes that status carries there."""
    responses = {}
    for key, description in codes.items():
        status = int(key.removeprefix("e"))
        responses[status] = OpenApiResponse(
            ErrorBody, description=f"{_MEANING[status]}: {description}"
        )
    return responses


def body_error_responses(**codes: str) -> dict[int, OpenApiResponse]:
    """:func:`error_responses` for an operation that reads a body: the refusals of any
    body (411, 413, 415, a body that is not JSON) come with it."""
    merged = {f"e{status}": text for status, text in BODY_REFUSALS.items()}
    for key, text in codes.items():
        merged[key] = f"{merged[key]}; {text}" if key in merged else text
    return error_responses(**merged)


def add_security_schemes(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: declare the bearer schemes operations name."""
    result.setdefault("components", {}).setdefault("securitySchemes", {}).update(SECURITY_SCHEMES)
    return result
