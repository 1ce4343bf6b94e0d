"""The ``Authorization: Bearer <token>`` header, read one way for every API."""

from __future__ import annotations


def bearer_token(authorization: str) -> str | None:
    """The token of a Bearer header, or None when the header is missing or of another scheme."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None
