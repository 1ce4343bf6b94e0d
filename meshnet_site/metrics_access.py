"""Who may read ``/metrics``: the token holder, or without a token a direct loopback client.

``REMOTE_ADDR`` says who connected, not who asked: behind a load balancer or
a reverse proxy every client arrives from the proxy's (private, often
loopback) address. So without ``MESHNET_METRICS_TOKEN`` the metrics go only
to a client that is loopback *and* came directly: no forwarding header
(``Forwarded``, ``X-Forwarded-*``, ``X-Real-IP``: what proxies add) and no
``MESHNET_BEHIND_PROXY`` / ``DJANGO_BEHIND_TLS_PROXY`` saying a proxy is in
front (one that adds no header looks direct). Anywhere else the token is
required: a LAN scraper, or a tracker behind a balancer, sets one.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping

from meshnet_site.bearer import bearer_token
from meshnet_site.errors import DomainError, ErrorKind

# What a proxy or load balancer adds to a request it forwards (as WSGI/ASGI META keys).
FORWARDING_HEADERS = (
    "HTTP_FORWARDED",
    "HTTP_X_FORWARDED_FOR",
    "HTTP_X_FORWARDED_HOST",
    "HTTP_X_FORWARDED_PROTO",
    "HTTP_X_REAL_IP",
)


class MetricsTokenRequired(DomainError):
    kind = ErrorKind.UNAUTHENTICATED
    code = "invalid_metrics_token"


class MetricsPrivate(DomainError):
    kind = ErrorKind.FORBIDDEN
    code = "metrics_private"


def metrics_refusal(
    *, token: str, behind_proxy: bool, meta: Mapping[str, object]
) -> DomainError | None:
    """Why this request may not read the metrics; None when it may.

    With ``token`` set: the request's ``Authorization: Bearer`` must be it. Without:
    only a direct loopback client (see the module docstring).
    """
    if token:
        given = bearer_token(str(meta.get("HTTP_AUTHORIZATION", ""))) or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            return MetricsTokenRequired("Send 'Authorization: Bearer <metrics token>'")
        return None
    if behind_proxy:
        why = "this tracker is behind a proxy (MESHNET_BEHIND_PROXY or DJANGO_BEHIND_TLS_PROXY)"
    elif any(meta.get(header) for header in FORWARDING_HEADERS):
        why = "the request was forwarded by a proxy"
    elif not _is_loopback(str(meta.get("REMOTE_ADDR", ""))):
        why = "the client is not on this machine"
    else:
        return None
    return MetricsPrivate(
        f"Metrics need MESHNET_METRICS_TOKEN here: {why}; without a token they are served "
        "to direct loopback clients only"
    )


def _is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
