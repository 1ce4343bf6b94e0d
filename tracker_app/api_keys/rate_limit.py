"""Per-API-key rate limit: a fixed one-minute window counted in the database.

The count is a durable guard (``meshnet_site.guards``): shared by every
tracker process over the one database, in the embedded deployment as in
production, and never evicted by other traffic the way a cache entry is.
"""

from __future__ import annotations

from datetime import UTC, datetime

from meshnet_site.errors import DomainError, ErrorKind
from meshnet_site.guards.services import count_hit, window_retry_after

WINDOW_SECONDS = 60


class RateLimitExceeded(DomainError):
    """The API key used up its requests for this window; ``retry_after`` says when the next
    window opens."""

    kind = ErrorKind.RATE_LIMITED
    code = "rate_limit_exceeded"


def rate_limit_check(*, key_hash: str, limit: int, now: float) -> None:
    """Count one request for the API key with ``key_hash``; ``RateLimitExceeded`` past ``limit``.

    Counters are named by the key's hash, which is unique to the key, so
    deployments never count each other's requests; ``now`` is Unix time.
    """
    moment = datetime.fromtimestamp(now, tz=UTC)
    count = count_hit(f"api-key:{key_hash}", window_seconds=WINDOW_SECONDS, now=moment)
    if count > limit:
        retry_after = window_retry_after(window_seconds=WINDOW_SECONDS, now=moment)
        raise RateLimitExceeded(
            f"Rate limit of {limit} requests per minute reached for this API key; "
            f"retry in {retry_after} s",
            retry_after=retry_after,
        )
