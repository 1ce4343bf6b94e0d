"""Tracker writes: client API keys."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from tracker_app.models import ApiKey

KEY_PREFIX = "mk-"


@dataclass(frozen=True)
class IssuedKey:
    api_key: ApiKey
    plain: str  # shown once to the operator, never stored


def api_key_hash(plain: str) -> str:
    # Keys carry 256 random bits, so a fast hash is enough to protect them at rest.
    return hashlib.sha256(plain.encode()).hexdigest()


def api_key_create(*, name: str) -> IssuedKey:
    plain = KEY_PREFIX + secrets.token_urlsafe(32)
    api_key = ApiKey.objects.create(
        name=name, prefix=plain[: len(KEY_PREFIX) + 6], key_hash=api_key_hash(plain)
    )
    return IssuedKey(api_key=api_key, plain=plain)


def api_key_lookup(*, plain: str) -> ApiKey | None:
    """The live key matching ``plain``, or None (unknown and revoked alike)."""
    return ApiKey.objects.filter(key_hash=api_key_hash(plain), revoked=False).first()
