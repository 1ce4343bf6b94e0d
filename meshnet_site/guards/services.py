"""Claiming a value once, counting hits in a fixed window, pruning what expired.

Each guard is one ``INSERT … ON CONFLICT … RETURNING`` statement against a
unique constraint, which SQLite (3.35+) and PostgreSQL both run atomically:
there is no read-then-write for two processes to interleave. On PostgreSQL
a second writer of the same row waits for the first to commit and then
sees its row; SQLite has one writer at a time.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection

from meshnet_site.guards.models import OnceClaim, WindowCounter

KEY_MAX_LENGTH = WindowCounter._meta.get_field("key").max_length or 200


def _sql(template: str, model: type[OnceClaim] | type[WindowCounter]) -> str:
    """``template`` with ``{table}`` and ``{column}`` names quoted for this database."""
    quote = connection.ops.quote_name
    columns = {field.column: quote(field.column) for field in model._meta.concrete_fields}
    return template.format(table=quote(model._meta.db_table), **columns)


_CLAIM = """
INSERT INTO {table} ({scope}, {digest}, {expires_at}) VALUES (%s, %s, %s)
ON CONFLICT ({scope}, {digest}) DO UPDATE SET {expires_at} = excluded.{expires_at}
WHERE {table}.{expires_at} <= %s
RETURNING {id}
"""

_HIT = """
INSERT INTO {table} ({key}, {window_start}, {count}, {expires_at}) VALUES (%s, %s, 1, %s)
ON CONFLICT ({key}, {window_start}) DO UPDATE SET {count} = {table}.{count} + 1
RETURNING {count}
"""


def claim_once(scope: str, value: str, *, until: datetime, now: datetime) -> bool:
    """Claim ``value`` within ``scope`` until ``until``; True for the one caller that got it.

    A value claimed before is refused (False) until its claim expires; an
    expired claim may be taken again. Of concurrent claims of the same value,
    from any thread or process over the same database, exactly one wins.
    Only a SHA-256 digest of ``value`` is stored.
    """
    digest = hashlib.sha256(value.encode()).hexdigest()
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(_sql(_CLAIM, OnceClaim), [scope, digest, adapt(until), adapt(now)])
        return cursor.fetchone() is not None


def window_start(*, window_seconds: int, now: datetime) -> int:
    """Unix second at which the fixed window holding ``now`` began."""
    return math.floor(now.timestamp() / window_seconds) * window_seconds


def window_retry_after(*, window_seconds: int, now: datetime) -> int:
    """Whole seconds (at least 1) until the window holding ``now`` ends."""
    end = window_start(window_seconds=window_seconds, now=now) + window_seconds
    return max(1, math.ceil(end - now.timestamp()))


def count_hit(key: str, *, window_seconds: int, now: datetime) -> int:
    """Count one hit for ``key`` in the fixed window holding ``now``; the window's count so far.

    The first hit of a window counts 1. Concurrent hits, from any thread or
    process over the same database, each get a distinct count: none is lost.
    """
    if len(key) > KEY_MAX_LENGTH:
        raise ValueError(f"counter key longer than {KEY_MAX_LENGTH} characters: {key[:40]}…")
    start = window_start(window_seconds=window_seconds, now=now)
    expires_at = datetime.fromtimestamp(start + window_seconds, tz=UTC)
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(_sql(_HIT, WindowCounter), [key, start, adapt(expires_at)])
        row = cursor.fetchone()
    return int(row[0])


@dataclass(frozen=True)
class GuardsPruned:
    """How many expired rows one prune deleted."""

    claims: int
    counters: int

    def to_dict(self) -> dict[str, int]:
        return {"claims": self.claims, "counters": self.counters}


def guards_prune(*, now: datetime) -> GuardsPruned:
    """Delete claims and counters that expired before ``now``: they guard nothing any more."""
    claims, _ = OnceClaim.objects.filter(expires_at__lt=now).delete()
    counters, _ = WindowCounter.objects.filter(expires_at__lt=now).delete()
    return GuardsPruned(claims=claims, counters=counters)
