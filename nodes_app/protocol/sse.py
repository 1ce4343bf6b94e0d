"""Server-sent events as the head streams them and the tracker reads them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from nodes_app.protocol.decoding import json_document
from nodes_app.protocol.errors import ProtocolError

SSE_DONE = "[DONE]"
# What a head streams after a step that gave the client no text (a token held
# back by the detokenizer or a stop sequence): an SSE comment, so the head's
# stream is never silent for longer than one step.
SSE_STEP_COMMENT = b": step\n\n"


def sse_event(payload: Mapping[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <compact JSON>`` (or a bare string: :data:`SSE_DONE`)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


def sse_data(line: str) -> Any:
    """The payload of one SSE line: its decoded JSON, :data:`SSE_DONE` as the string, or None.

    None for blank lines, comments and other fields. Raises
    :class:`ProtocolError` when a ``data:`` line is not JSON.
    """
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data:
        return None
    if data == SSE_DONE:
        return SSE_DONE
    try:
        return json_document(data)
    except ValueError as error:
        raise ProtocolError(f"an event's data is not JSON: {error}") from None
