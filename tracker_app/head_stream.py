"""Reading one head's ``/v1/generate`` stream, and what each way it can go wrong means.

:func:`head_stream` sends a :class:`~nodes_app.protocol.GenerateRequest` to
its hop 0 and yields the head's chunk frames as they arrive. It ends
normally only after a frame with a ``finish_reason``; otherwise it raises
one of three things, each asking the caller for a different response:

- :class:`HeadRefused` (a domain error, 400 or 413): the head refused the
  request itself (too long for the context, a template that rejects the
  messages, a body or prompt past its caps): the client's to fix, no node to
  ban. A head answers 4xx only for its requester's fault (ADR-0002).
- :class:`RouteBusy`: a node of the route is at its session cap (the head's
  503, or a ``hop_busy`` frame): wait for a slot, ban nobody.
- :class:`HopFailure`: a node of the route failed (connection error, any
  other status, an error frame, a malformed frame, a stream that ends before
  the last token): ban ``node_id`` and fail over.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable

import httpx
from rest_framework import status

from meshnet_site.errors import DomainError, ErrorKind
from nodes_app.protocol import (
    SSE_DONE,
    ChunkFrame,
    ErrorFrame,
    GenerateRequest,
    ProtocolError,
    parse_frame,
    sse_data,
)

UPSTREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=30.0, pool=30.0)
# A head's refusals that are the client's fault, and how the client sees them.
CLIENT_FAULTS = {
    status.HTTP_400_BAD_REQUEST: ErrorKind.INVALID,
    status.HTTP_413_REQUEST_ENTITY_TOO_LARGE: ErrorKind.TOO_LARGE,
}
# At most this much of a head's error answer is read.
MAX_REFUSAL_BYTES = 64 * 1024


class HopFailure(Exception):
    """A node of the route failed; the proxy bans ``node_id`` and fails over."""

    def __init__(self, node_id: str, message: str) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.message = message


class RouteBusy(Exception):
    """A node of the route is at its session cap: wait for a slot, ban nobody."""


class HeadRefused(DomainError):
    """The head refused the request as invalid; ``code`` is the head's own."""

    kind = ErrorKind.INVALID


async def head_stream(
    *,
    client: httpx.AsyncClient,
    request: GenerateRequest,
    on_connected: Callable[[], Awaitable[None]] | None = None,
) -> AsyncGenerator[ChunkFrame, None]:
    """The head's frames for ``request``, up to and including the one that finishes it.

    ``on_connected`` runs once the head has accepted the request (200),
    before its first frame. Raises :class:`HeadRefused`, :class:`RouteBusy`
    or :class:`HopFailure` as the module docstring says; a head that sends
    more tokens than ``max_tokens`` allows, or blames a node outside the
    plan, is itself the one that failed.
    """
    head = request.hops[0]
    route = {hop.node_id for hop in request.hops}
    tokens = len(request.resume_token_ids)
    finished = False
    try:
        async with client.stream(
            "POST",
            f"{head.endpoint}/v1/generate",
            json=request.to_json(),
            timeout=UPSTREAM_TIMEOUT,
        ) as response:
            if response.status_code == status.HTTP_503_SERVICE_UNAVAILABLE:
                raise RouteBusy()
            if response.status_code in CLIENT_FAULTS:
                body = await _read_at_most(response, MAX_REFUSAL_BYTES)
                raise _refusal(body, kind=CLIENT_FAULTS[response.status_code])
            if response.status_code != status.HTTP_200_OK:
                text = (await _read_at_most(response, 300)).decode(errors="replace")
                raise HopFailure(head.node_id, f"head answered {response.status_code}: {text}")
            if on_connected is not None:
                await on_connected()
            async for line in response.aiter_lines():
                if finished:
                    continue  # read on to the end, so the connection is kept alive
                try:
                    payload = sse_data(line)
                    if payload is None or payload == SSE_DONE:
                        continue
                    frame = parse_frame(payload)
                except ProtocolError as error:
                    raise HopFailure(head.node_id, f"malformed frame: {error}") from error
                if isinstance(frame, ErrorFrame):
                    if frame.busy:
                        raise RouteBusy()
                    # The head may only blame a node of this route; otherwise it is at fault.
                    blamed = frame.node_id if frame.node_id in route else head.node_id
                    raise HopFailure(blamed, frame.message)
                tokens += len(frame.token_ids)
                if tokens > request.max_tokens:
                    raise HopFailure(
                        head.node_id,
                        f"malformed frame: the head sent more than the {request.max_tokens} "
                        "tokens asked",
                    )
                finished = frame.finish_reason is not None
                yield frame
    except httpx.HTTPError as error:
        if finished:
            return  # the answer was complete; only the connection's close failed
        raise HopFailure(head.node_id, f"{type(error).__name__}: {error}") from error
    if not finished:
        raise HopFailure(head.node_id, "the head's stream ended before the last token")


async def _read_at_most(response: httpx.Response, limit: int) -> bytes:
    body = b""
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= limit:
            break
    return body[:limit]


def _refusal(body: bytes, *, kind: ErrorKind) -> HeadRefused:
    try:
        error = json.loads(body)["error"]
        message, code = str(error["message"]), str(error.get("code") or "invalid_request")
    except (ValueError, KeyError, TypeError):
        message, code = body.decode(errors="replace")[:300], "invalid_request"
    return HeadRefused(f"The model's node refused the request: {message}", code=code, kind=kind)
