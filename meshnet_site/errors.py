"""The one error type of the HTTP API and its OpenAI-shaped body.

Every API error, from any app, reaches the client as
``{"error": {"message": ..., "type": ..., "code": ...}}`` with a fitting status.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler


class ApiError(Exception):
    """A failure the client should see, with its HTTP status and machine-readable code."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status_code: int = status.HTTP_400_BAD_REQUEST,
        error_type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status_code = status_code
        self.error_type = error_type
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, code=self.code, error_type=self.error_type)


def error_body(message: str, *, code: str, error_type: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "code": code}}


def validation_message(detail: Any) -> str:
    """DRF validation detail as one readable line."""
    return "; ".join(_flatten(detail))


def _flatten(detail: Any, prefix: str = "") -> list[str]:
    """Turn DRF's nested validation detail into readable 'field: message' lines."""
    if isinstance(detail, dict):
        lines: list[str] = []
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            lines += _flatten(value, f"{prefix}{name}." if name else prefix)
        return lines
    if isinstance(detail, list):
        return [line for item in detail for line in _flatten(item, prefix)]
    field = prefix.rstrip(".")
    return [f"{field}: {detail}" if field else str(detail)]


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler that answers every error in OpenAI's shape."""
    if isinstance(exc, ApiError):
        return Response(exc.body(), status=exc.status_code, headers=exc.headers)
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        message = validation_message(exc.detail)
        code = "invalid_request"
    elif isinstance(exc, exceptions.ParseError):
        message, code = f"Request body is not valid JSON: {exc.detail}", "invalid_json"
    elif isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        message, code = str(exc.detail), "invalid_credentials"
    else:
        message, code = str(getattr(exc, "detail", exc)), getattr(exc, "default_code", "error")
    error_type = "invalid_request_error" if response.status_code < 500 else "server_error"
    if response.status_code in (401, 403):
        error_type = "authentication_error"
    response.data = error_body(message, code=str(code), error_type=error_type)
    return response
