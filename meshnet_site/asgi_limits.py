"""Request bodies bounded before anyone reads them: refused on their headers alone.

Every HTTP request the tracker serves carries at most
``MESHNET_MAX_REQUEST_BYTES`` of body, and a body must say its length up
front: one over the limit is a 413, a chunked one without ``Content-Length``
a 411, both in the error shape and before a byte of the body is read.
:func:`body_refusal` is the rule; two places apply it:

- :class:`BoundedBodies`, ASGI middleware around the whole application
  (``meshnet_site.asgi``), so the rule holds under any ASGI server;
- :class:`BoundedServer`, daphne as ``runtracker`` runs it. Twisted spools a
  request's whole body (into a temporary file past 100 kB) before daphne
  calls the application at all, so the middleware alone would refuse only
  after the disk write; this server refuses as soon as the headers are in
  and closes the connection, never storing the body.

:class:`BoundedServer` also names, when it is one of ``runtracker --processes
N``, which process answered: every HTTP response carries
``Meshnet-Tracker-Process: I/N`` (ADR-0023).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from io import BytesIO
from typing import Any

from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.server import Server
from twisted.web import http

from meshnet_site.errors import DomainError, ErrorKind, http_error

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# The response header that names the server process of ``runtracker --processes N``.
PROCESS_HEADER = "Meshnet-Tracker-Process"


class RequestTooLarge(DomainError):
    kind = ErrorKind.TOO_LARGE
    code = "request_too_large"


class LengthRequired(DomainError):
    kind = ErrorKind.LENGTH_REQUIRED
    code = "length_required"


def body_refusal(*, content_length: int | None, chunked: bool, limit: int) -> DomainError | None:
    """Why a request whose headers say this must be refused unread, or None to serve it."""
    if chunked and content_length is None:
        return LengthRequired(
            "Send the body with a Content-Length header (chunked bodies are not accepted)"
        )
    if content_length is not None and content_length > limit:
        return RequestTooLarge(f"Request body is larger than {limit} bytes")
    return None


def _refusal_bytes(refusal: DomainError) -> tuple[int, bytes]:
    answer = http_error(refusal)
    return answer.status, json.dumps(answer.body, separators=(",", ":")).encode()


class BoundedBodies:
    """ASGI middleware: HTTP requests that :func:`body_refusal` refuses never reach ``app``."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers", []))
            declared = headers.get(b"content-length", b"").strip()
            refusal = body_refusal(
                content_length=int(declared) if declared.isdigit() else None,
                chunked=b"chunked" in headers.get(b"transfer-encoding", b"").lower(),
                limit=self.limit,
            )
            if refusal is not None:
                status, body = _refusal_bytes(refusal)
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"connection", b"close"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class _BoundedRequest(WebRequest):
    """Daphne's request, judged by :func:`body_refusal` once its headers are in."""

    refused = False

    def gotLength(self, length: int | None) -> None:
        # Twisted knows the length from the headers: None means chunked.
        refusal = body_refusal(
            content_length=length, chunked=length is None, limit=self.server.max_body_bytes
        )
        if refusal is None:
            super().gotLength(length)
            return
        self.refused = True
        self.content = BytesIO()  # what arrives anyway is dropped, never stored
        # No "100 Continue" for a body that is refused.
        self.requestHeaders.removeHeader(b"Expect")
        status, body = _refusal_bytes(refusal)
        head = (
            f"HTTP/1.1 {status} {http.RESPONSES[status].decode()}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        self.channel.transport.write(head.encode() + body)
        # Stops reading at once; closes when the answer is written.
        self.channel.transport.loseConnection()

    def handleContentChunk(self, data: bytes) -> None:
        if not self.refused:
            super().handleContentChunk(data)

    def process(self) -> Any:
        if not self.refused:
            return super().process()
        return None

    def handle_reply(self, message: MutableMapping[str, Any]) -> None:
        super().handle_reply(message)
        label = self.server.process_label
        if label is not None and message.get("type") == "http.response.start":
            # Headers go out with the first body bytes: there is still time.
            self.setHeader(PROCESS_HEADER, label)


class _BoundedHTTPFactory(HTTPFactory):
    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = _BoundedRequest
        return protocol


class BoundedServer(Server):
    """Daphne's server, refusing over-size and chunked bodies before they are received;
    with ``process_label`` (``I/N``), naming itself in every HTTP response."""

    def __init__(
        self, *args: Any, max_body_bytes: int, process_label: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.max_body_bytes = max_body_bytes
        self.process_label = process_label

    # Server.run() builds its HTTP factory inline, with no hook to choose the
    # request class: whatever factory it assigns, this one takes its place.
    @property
    def http_factory(self) -> Any:
        return self._bounded_factory

    @http_factory.setter
    def http_factory(self, factory: Any) -> None:
        self._bounded_factory = _BoundedHTTPFactory(self)
