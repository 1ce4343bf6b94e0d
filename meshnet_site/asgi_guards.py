"""An ASGI guard in front of every protocol: a Host not in ``ALLOWED_HOSTS`` is refused.

Django checks the Host header only when a view asks for it
(``request.get_host()``), and the Channels consumers — the streaming chat
endpoint and the websockets — never do. Wrapping the whole
``ProtocolTypeRouter`` holds every HTTP path and websocket to the same rule,
with Django's own matching (``validate_host``, wildcards like ``.example.com``).
An HTTP request is answered 400 ``disallowed_host`` in the documented error
shape; a websocket is closed before it is accepted (the server answers 403).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host

from meshnet_site.errors import DomainError, ErrorKind, http_error

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Django's own fallback while DEBUG is on and ALLOWED_HOSTS is empty.
DEBUG_HOSTS = [".localhost", "127.0.0.1", "[::1]"]


class DisallowedHost(DomainError):
    kind = ErrorKind.INVALID
    code = "disallowed_host"


def host_allowed(scope: Scope) -> bool:
    """Whether the request's Host (or, without one, the server's name) is allowed."""
    host = _header(scope, b"host")
    if host is None:
        server = scope.get("server") or ("", None)
        host = str(server[0]) if server[1] in (None, 80, 443) else f"{server[0]}:{server[1]}"
    domain, _port = split_domain_port(host)
    allowed = list(settings.ALLOWED_HOSTS) or (DEBUG_HOSTS if settings.DEBUG else [])
    return bool(domain) and validate_host(domain, allowed)


class AllowedHostsGuard:
    """Wraps an ASGI app; refuses HTTP and websocket scopes whose Host is not allowed."""

    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or host_allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
            return
        host = _header(scope, b"host") or ""
        answer = http_error(DisallowedHost(f"Host {host[:100]!r} is not served here"))
        body = json.dumps(answer.body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": answer.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None
