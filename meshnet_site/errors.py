"""Domain errors and the one place that turns them into HTTP answers.

Services, the planner, the choice and the proxy raise :class:`DomainError`
subclasses: a message for people, a machine-readable ``code`` and a
:class:`ErrorKind` that says what sort of failure it is. They know nothing of
HTTP. :func:`http_error` maps a kind to its status and OpenAI error ``type``,
so every error, from any app and any entry point (DRF views, the chat
consumer), reaches the client as
``{"error": {"message": ..., "type": ..., "code": ...}}``; the Anthropic
Messages endpoint's clients get the same status in Anthropic's shape
(:func:`anthropic_http_error`).

A database that cannot be reached (down, restarting, a connection cut) is no
bug of the request's: :func:`database_unavailable` turns it into a 503 in that
same shape, and the next request connects afresh (``CONN_HEALTH_CHECKS``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import psycopg
from django.db import InterfaceError, OperationalError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

logger = logging.getLogger(__name__)


class ErrorKind(StrEnum):
    """What sort of failure an error is; :data:`HTTP_STATUS` says how HTTP shows it."""

    INVALID = "invalid"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    NOT_ALLOWED = "not_allowed"
    CONFLICT = "conflict"
    TOO_LARGE = "too_large"
    LENGTH_REQUIRED = "length_required"
    RATE_LIMITED = "rate_limited"
    INTERNAL = "internal"
    UPSTREAM = "upstream"
    UNAVAILABLE = "unavailable"


# kind → (HTTP status, OpenAI error type). The only place that knows both.
HTTP_STATUS: dict[ErrorKind, tuple[int, str]] = {
    ErrorKind.INVALID: (status.HTTP_400_BAD_REQUEST, "invalid_request_error"),
    ErrorKind.UNAUTHENTICATED: (status.HTTP_401_UNAUTHORIZED, "authentication_error"),
    ErrorKind.FORBIDDEN: (status.HTTP_403_FORBIDDEN, "authentication_error"),
    ErrorKind.NOT_FOUND: (status.HTTP_404_NOT_FOUND, "invalid_request_error"),
    ErrorKind.NOT_ALLOWED: (status.HTTP_405_METHOD_NOT_ALLOWED, "invalid_request_error"),
    ErrorKind.CONFLICT: (status.HTTP_409_CONFLICT, "invalid_request_error"),
    ErrorKind.TOO_LARGE: (status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, "invalid_request_error"),
    ErrorKind.LENGTH_REQUIRED: (status.HTTP_411_LENGTH_REQUIRED, "invalid_request_error"),
    ErrorKind.RATE_LIMITED: (status.HTTP_429_TOO_MANY_REQUESTS, "rate_limit_error"),
    ErrorKind.INTERNAL: (status.HTTP_500_INTERNAL_SERVER_ERROR, "server_error"),
    ErrorKind.UPSTREAM: (status.HTTP_502_BAD_GATEWAY, "upstream_error"),
    ErrorKind.UNAVAILABLE: (status.HTTP_503_SERVICE_UNAVAILABLE, "server_error"),
}


# kind → Anthropic's error ``type`` (the Messages API's shape; the status is the same).
ANTHROPIC_ERROR_TYPE: dict[ErrorKind, str] = {
    ErrorKind.INVALID: "invalid_request_error",
    ErrorKind.UNAUTHENTICATED: "authentication_error",
    ErrorKind.FORBIDDEN: "permission_error",
    ErrorKind.NOT_FOUND: "not_found_error",
    ErrorKind.NOT_ALLOWED: "invalid_request_error",
    ErrorKind.CONFLICT: "invalid_request_error",
    ErrorKind.TOO_LARGE: "request_too_large",
    ErrorKind.LENGTH_REQUIRED: "invalid_request_error",
    ErrorKind.RATE_LIMITED: "rate_limit_error",
    ErrorKind.INTERNAL: "api_error",
    ErrorKind.UPSTREAM: "api_error",
    ErrorKind.UNAVAILABLE: "overloaded_error",
}


class DomainError(Exception):
    """A failure the caller should see: ``message``, machine-readable ``code``, ``kind``.

    Subclasses fix the kind (and often the code) for one failure of their
    domain, e.g. ``NoRouteAvailable``. ``retry_after`` (seconds) tells a
    caller when trying again may succeed. ``param`` names the request field
    at fault, as OpenAI's errors do, when there is one.
    """

    kind: ErrorKind = ErrorKind.INVALID
    code: str = "invalid_request"
    param: str | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        kind: ErrorKind | None = None,
        retry_after: int | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if kind is not None:
            self.kind = kind
        if param is not None:
            self.param = param
        self.retry_after = retry_after


class DatabaseUnavailable(DomainError):
    """The database did not answer; trying again shortly may succeed."""

    kind = ErrorKind.UNAVAILABLE
    code = "database_unavailable"


DATABASE_RETRY_AFTER_SECONDS = 5
# SQLSTATEs of a server going away: admin shutdown, crash shutdown, cannot
# connect now. Class 08 (connection exceptions) counts whole.
_SHUTDOWN_STATES = frozenset({"57P01", "57P02", "57P03"})


def is_database_outage(error: BaseException) -> bool:
    """Whether ``error`` says the database could not be reached: down, restarting,
    the connection cut, or no pooled connection free in time.

    Not a deadlock, a serialisation failure, a lock or statement timeout, a
    bad query or a missing table (on PostgreSQL or SQLite): those stay 500s,
    logged as bugs.
    """
    if isinstance(error, InterfaceError):
        return True
    if not isinstance(error, OperationalError):
        return False
    cause = error.__cause__
    if not isinstance(cause, psycopg.Error):
        return False
    state = cause.sqlstate  # None: the client's own failure to connect or to get one
    return state is None or state.startswith("08") or state in _SHUTDOWN_STATES


def database_unavailable() -> DatabaseUnavailable:
    """The error to answer for a database outage (see :func:`is_database_outage`)."""
    # Not the driver's message: it names the database's host and user.
    return DatabaseUnavailable(
        "The tracker's database is unavailable; retry shortly",
        retry_after=DATABASE_RETRY_AFTER_SECONDS,
    )


@dataclass(frozen=True)
class HttpError:
    """A domain error as HTTP shows it: status, the OpenAI-shaped body, headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def http_error(error: DomainError) -> HttpError:
    status_code, error_type = HTTP_STATUS[error.kind]
    headers = {} if error.retry_after is None else {"Retry-After": str(error.retry_after)}
    body = error_body(error.message, code=error.code, error_type=error_type, param=error.param)
    return HttpError(status_code, body, headers)


def anthropic_http_error(error: DomainError) -> HttpError:
    """``error`` as the Anthropic Messages API answers one:
    ``{"type": "error", "error": {"type", "message"}}``, with the same status."""
    status_code, _ = HTTP_STATUS[error.kind]
    headers = {} if error.retry_after is None else {"Retry-After": str(error.retry_after)}
    return HttpError(status_code, anthropic_error_body(error), headers)


def anthropic_error_body(error: DomainError) -> dict[str, Any]:
    """Anthropic's error body (its stream's ``error`` event carries the same)."""
    return {
        "type": "error",
        "error": {"type": ANTHROPIC_ERROR_TYPE[error.kind], "message": error.message},
    }


def error_body(
    message: str, *, code: str, error_type: str, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error body; ``param`` (the request field at fault) only when one is named."""
    error = {"message": message, "type": error_type, "code": code}
    if param is not None:
        error["param"] = param
    return {"error": error}


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
    field_name = prefix.rstrip(".")
    return [f"{field_name}: {detail}" if field_name else str(detail)]


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler that answers every error in OpenAI's shape."""
    if is_database_outage(exc):
        logger.warning("the database is unavailable", exc_info=exc)
        exc = database_unavailable()
    if isinstance(exc, DomainError):
        answer = http_error(exc)
        return Response(answer.body, status=answer.status, headers=answer.headers)
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
