"""The API key a staff member's dashboard session chats with (``/v1/chat/completions``).

The dashboard sends no API key. It sends the staff user's session cookie and
the CSRF token of the page (header ``X-CSRFToken``); Django's own CSRF check
(origin and token against the cookie) runs on it, so a page on another site
cannot chat with a staff member's session. Such requests are billed to the
user's own API key, ``dashboard:<username>``, created on first use; revoking
that key in the admin stops the user's dashboard chat.
"""

from __future__ import annotations

import io
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib import auth
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware

from meshnet_site.errors import DomainError, ErrorKind
from tracker_app.api_keys.services import api_key_create
from tracker_app.models import ApiKey

KEY_NAME_PREFIX = "dashboard:"


class DashboardCsrfFailed(DomainError):
    kind = ErrorKind.FORBIDDEN
    code = "csrf_failed"


class DashboardKeyRevoked(DomainError):
    kind = ErrorKind.FORBIDDEN
    code = "dashboard_key_revoked"


def dashboard_chat_api_key(*, scope: dict[str, Any]) -> ApiKey | None:
    """The API key to bill a chat request sent by a staff member's dashboard.

    None when the request carries no session of an active staff user (the
    caller then asks for a Bearer key). Raises ``DashboardCsrfFailed`` when
    the session is there but the request fails Django's CSRF check, and
    ``DashboardKeyRevoked`` when the user's dashboard key was revoked.
    """
    request = ASGIRequest(scope, io.BytesIO())
    session_key = request.COOKIES.get(settings.SESSION_COOKIE_NAME)
    if not session_key:
        return None
    engine = import_module(settings.SESSION_ENGINE)
    request.session = engine.SessionStore(session_key)
    user = auth.get_user(request)
    if not (user.is_active and user.is_staff):
        return None
    if not _csrf_passes(request):
        raise DashboardCsrfFailed(
            "A chat on a dashboard session needs the page's CSRF token and origin "
            "(other clients send 'Authorization: Bearer <key>')"
        )
    return staff_api_key(username=user.get_username())


def staff_api_key(*, username: str) -> ApiKey:
    """The live ``dashboard:<username>`` key, created when the user has none yet.

    Two first requests at once may each create one; the oldest is used from
    then on, so the extra one stays unused.
    """
    name = f"{KEY_NAME_PREFIX}{username}"
    keys = list(ApiKey.objects.filter(name=name).order_by("created_at", "pk"))
    live = [key for key in keys if not key.revoked]
    if live:
        return live[0]
    if keys:
        raise DashboardKeyRevoked(f"The API key {name!r} is revoked; chat is off for this user")
    # The plain key is never shown: only the session can use this key.
    return api_key_create(name=name).api_key


def _csrf_passes(request: HttpRequest) -> bool:
    """Whether Django's CSRF middleware lets ``request`` through (it logs why not)."""

    def unreachable(_: HttpRequest) -> HttpResponse:  # the middleware's view is never called
        raise AssertionError

    middleware = CsrfViewMiddleware(unreachable)
    try:
        middleware.process_request(request)
        response = middleware.process_view(request, unreachable, (), {})
    except DisallowedHost:
        return False
    return response is None
