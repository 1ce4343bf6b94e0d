"""Plain tracker views: health, Prometheus metrics, and the API's 404."""

import hmac
import ipaddress
import logging

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django_prometheus.exports import ExportToDjangoView

from meshnet_site.bearer import bearer_token
from meshnet_site.errors import DomainError, ErrorKind, http_error

logger = logging.getLogger(__name__)


# How much of an unknown path a 404's message repeats.
MAX_ECHOED_PATH = 200


class ApiPathNotFound(DomainError):
    kind = ErrorKind.NOT_FOUND
    code = "not_found"


@csrf_exempt  # API clients send no CSRF token: every method gets its JSON 404
def api_not_found(request: HttpRequest) -> JsonResponse:
    """Any path under ``/v1/`` that the tracker does not serve: a 404 in the error shape."""
    path = request.path[:MAX_ECHOED_PATH]
    return _refusal(ApiPathNotFound(f"Unknown API path: {request.method} {path}"))


class MetricsTokenRequired(DomainError):
    kind = ErrorKind.UNAUTHENTICATED
    code = "invalid_metrics_token"


class MetricsPrivate(DomainError):
    kind = ErrorKind.FORBIDDEN
    code = "metrics_private"


def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database answers a query, 503 otherwise."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception:  # any database failure means unhealthy
        logger.exception("health check: the database did not answer")
        return JsonResponse({"status": "unavailable", "database": "unavailable"}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics, for ``Authorization: Bearer <MESHNET_METRICS_TOKEN>`` when a
    token is set, else for loopback and private client addresses only."""
    token: str = settings.MESHNET_METRICS_TOKEN
    if token:
        given = bearer_token(request.headers.get("Authorization", "")) or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            return _refusal(MetricsTokenRequired("Send 'Authorization: Bearer <metrics token>'"))
    elif not _is_private(request.META.get("REMOTE_ADDR", "")):
        return _refusal(
            MetricsPrivate("Metrics are served to private addresses only (or with a token)")
        )
    response: HttpResponse = ExportToDjangoView(request)
    return response


# Loopback and the private ranges of RFC 1918 and RFC 4193 (Python's ``is_private``
# also counts documentation and benchmark ranges, which are no one's LAN).
PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(network)
    for network in (
        "127.0.0.0/8",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "::1/128",
        "fc00::/7",
    )
)


def _is_private(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in PRIVATE_NETWORKS)


def _refusal(error: DomainError) -> JsonResponse:
    answer = http_error(error)
    return JsonResponse(answer.body, status=answer.status, headers=answer.headers)
