"""Plain tracker views: health, Prometheus metrics, and the API's 404."""

import logging

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django_prometheus.exports import ExportToDjangoView
from prometheus_client import generate_latest

from meshnet_site.errors import DomainError, ErrorKind, http_error
from meshnet_site.metrics_access import metrics_refusal
from nodes_app.metrics import NODE_FIGURES

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
    """Prometheus metrics (the processes' own, then the nodes' figures,
    ``nodes_app.metrics``), for ``Authorization: Bearer <MESHNET_METRICS_TOKEN>`` when a
    token is set, else for a direct loopback client only (``meshnet_site.metrics_access``)."""
    refusal = metrics_refusal(
        token=settings.MESHNET_METRICS_TOKEN,
        behind_proxy=settings.MESHNET_BEHIND_PROXY,
        meta=request.META,
    )
    if refusal is not None:
        return _refusal(refusal)
    response: HttpResponse = ExportToDjangoView(request)
    # The nodes' figures come from the registry, not from this process's metrics (or
    # every process's, in multiprocess mode): appended as families of their own.
    response.content += generate_latest(NODE_FIGURES)
    return response


def _refusal(error: DomainError) -> JsonResponse:
    answer = http_error(error)
    return JsonResponse(answer.body, status=answer.status, headers=answer.headers)
