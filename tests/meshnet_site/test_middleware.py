"""A page whose database is away: a 503 page, not Django's 500 (the unit; the fault
test in tests/tracker/test_service_outages.py cuts a real PostgreSQL link)."""

from __future__ import annotations

from django.db import ProgrammingError
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from meshnet_site.middleware import DatabaseOutageMiddleware
from tests.support.database_errors import connection_cut


def _middleware() -> DatabaseOutageMiddleware:
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("never drawn")

    return DatabaseOutageMiddleware(view)


def test_a_page_whose_database_is_away_answers_503_saying_so_with_retry_after() -> None:
    request = RequestFactory().get("/dashboard/")

    response = _middleware().process_exception(request, connection_cut())

    assert response is not None
    assert (response.status_code, response["Retry-After"]) == (503, "5")
    assert "database is unavailable" in response.content.decode()


def test_any_other_error_is_left_to_django() -> None:
    request = RequestFactory().get("/dashboard/")

    assert _middleware().process_exception(request, ProgrammingError("no such column")) is None
