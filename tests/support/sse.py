"""Reading server-sent event streams (a head's ``/v1/generate``, the tracker's chat).

Lines are parsed by the protocol's ``sse_data``, the one the tracker uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import httpx

from nodes_app.protocol.sse import sse_data


def iter_sse(
    url: str, body: dict[str, Any], *, headers: dict[str, str] | None = None, timeout: float = 180
) -> Iterator[Any]:
    """POST ``body`` and yield every ``data:`` payload while the stream is open.

    Asserts a 200 event stream. Breaking out of the loop closes the connection.
    """
    with httpx.stream("POST", url, json=body, headers=headers, timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            payload = sse_data(line)
            if payload is not None:
                yield payload


def read_sse(
    url: str, body: dict[str, Any], *, headers: dict[str, str] | None = None, timeout: float = 180
) -> list[Any]:
    """Every ``data:`` payload of a whole stream, parsed (``"[DONE]"`` kept as the string)."""
    return list(iter_sse(url, body, headers=headers, timeout=timeout))


def chunks_of(frames: list[Any]) -> list[dict[str, Any]]:
    """The chat chunks of a stream (no errors, no ``[DONE]``)."""
    return [f for f in frames if isinstance(f, dict) and "choices" in f]


def text_of(frames: list[Any]) -> str:
    """The text a stream's chunks carry, joined."""
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks_of(frames))


def completion(frames: list[Any]) -> tuple[str, list[int], dict[str, Any]]:
    """(text, token ids, last chunk) of a finished ``/v1/generate`` stream."""
    chunks = chunks_of(frames)
    ids = [i for c in chunks for i in c.get("meshnet_token_ids", [])]
    return text_of(frames), ids, chunks[-1]


def sse_frames(lines: Iterable[str]) -> list[Any]:
    """Every payload of a whole SSE body's lines, :data:`SSE_DONE` kept."""
    return [payload for line in lines if (payload := sse_data(line)) is not None]
