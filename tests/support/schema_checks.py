"""The tracker's OpenAPI schema, as a live tracker serves it, and schemathesis' checks.

``live_schema`` loads ``/api/schema/`` from a running tracker, aimed at that
tracker. ``assert_conforms`` runs the four checks the schema tests hold every
answer to (no 5xx, a documented status, a documented content type, a body
that matches the documented schema) on a real response of one operation;
``CHECKS`` are the same four for schemathesis' own generated requests.
"""

from __future__ import annotations

from typing import Any

import httpx
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def live_schema(tracker_url: str, **config: Any) -> Any:
    """The schema ``tracker_url`` serves, its operations aimed at that tracker.

    ``config`` updates schemathesis' project configuration (e.g. ``headers``).
    """
    raw = httpx.get(f"{tracker_url}/api/schema/", params={"format": "json"}, timeout=30)
    raw.raise_for_status()
    schema = schemathesis.openapi.from_dict(raw.json())
    schema.config.update(base_url=tracker_url, **config)
    return schema


def assert_conforms(schema: Any, method: str, path: str, response: httpx.Response) -> None:
    """``response``, a real answer of ``method path`` (the schema's path template), passes
    every check of ``CHECKS``; a failure names what the schema did not expect."""
    case = schema[path][method].Case()
    case.validate_response(response, checks=CHECKS)
