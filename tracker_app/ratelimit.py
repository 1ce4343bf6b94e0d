"""Per-API-key rate limit: a fixed one-minute window counted in the shared cache.

With Redis configured the count is shared by every tracker process, so the
limit holds for the whole deployment, not per process.
"""

from __future__ import annotations

import math

from django.core.cache import cache

from meshnet_site.errors import DomainError, ErrorKind

WINDOW_SECONDS = 60


class RateLimitExceeded(DomainError):
    """The API key used up its requests for this window; ``retry_after`` says when the next
    window opens."""

    kind = ErrorKind.RATE_LIMITED
    code = "rate_limit_exceeded"


def rate_limit_check(*, key_hash: str, limit: int, now: float) -> None:
    """Count one request for the API key with ``key_hash``; ``RateLimitExceeded`` past ``limit``.

    Counters are named by the key's hash, which is unique to the key wherever
    it lives, so trackers of different deployments sharing one Redis never
    count each other's requests.
    """
    window = int(now // WINDOW_SECONDS)
    counter = f"ratelimit:{key_hash[:24]}:{window}"
    cache.add(counter, 0, timeout=WINDOW_SECONDS * 2)
    count = cache.incr(counter)
    if count > limit:
        retry_after = max(1, math.ceil((window + 1) * WINDOW_SECONDS - now))
        raise RateLimitExceeded(
            f"Rate limit of {limit} requests per minute reached for this API key; "
            f"retry in {retry_after} s",
            retry_after=retry_after,
        )
