"""Client credentials for the tracker's read APIs: the same Bearer API key the chat takes.

``ApiKeyAuthentication`` is a DRF authenticator: a valid key makes
``request.auth`` the :class:`~tracker_app.models.ApiKey` (the user stays
anonymous, since keys belong to no account). A missing header is no answer
(the next authenticator, e.g. a staff session, may still succeed); a wrong
or revoked key is refused at once.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from meshnet_site.bearer import bearer_token
from meshnet_site.errors import DomainError, ErrorKind
from tracker_app.api_keys.services import api_key_lookup


class InvalidApiKey(DomainError):
    kind = ErrorKind.UNAUTHENTICATED
    code = "invalid_api_key"


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        key = bearer_token(request.headers.get("Authorization", ""))
        if key is None:
            return None
        api_key = api_key_lookup(plain=key)
        if api_key is None:
            raise InvalidApiKey("Invalid API key: send 'Authorization: Bearer <key>'")
        return AnonymousUser(), api_key

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"
