"""A page whose database is unreachable answers 503, not Django's 500."""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.utils.deprecation import MiddlewareMixin

from meshnet_site.errors import database_unavailable, http_error, is_database_outage

logger = logging.getLogger(__name__)


class DatabaseOutageMiddleware(MiddlewareMixin):
    """The dashboard's and the admin's pages, while the database is away: a 503 page
    saying so, with ``Retry-After``, as the API answers ``database_unavailable``.

    Any other error is left to Django (a 500, logged as a bug), and so is an
    outage met outside a view (e.g. saving the session as the response leaves).
    The page is drawn without the request's context: the session and the user
    live in the database.
    """

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_database_outage(exception):
            return None
        logger.warning("%s %s: the database is unavailable", request.method, request.path)
        # The API's answer to the same outage, as a page: its status and Retry-After.
        error = database_unavailable()
        answer = http_error(error)
        page = render_to_string("outage.html", {"retry_after": error.retry_after})
        response = HttpResponse(page, status=answer.status, headers=answer.headers)
        # Logged above as what it is: not Django's "Service Unavailable" error line.
        response._has_been_logged = True  # type: ignore[attr-defined]
        return response
