"""Each API key's share of the network: requests and reserved KV tokens in flight.

A rate per minute does not stop one key from holding every slot of a route:
two ``n = 4`` streams of 4,000 tokens fill a small route's KV budget for as
long as they run, and every other key's request waits out the busy deadline.
So a key may have at most so many requests in flight at once, reserving at
most so many KV tokens in all — a request reserves what the nodes will hold
for it, (prompt + ``max_tokens``) × its choices. The limits are the
deployment's (``MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT``,
``MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT``) unless the key's own fields say
otherwise (the admin). A request past its key's share is refused at once
(429, saying which limit), before any route is chosen.

Each request in flight is a :class:`~tracker_app.models.KeyLease` row, shared
by every tracker over the one database. Taking one is a single statement
that inserts it only if the key's live leases leave room under both limits
(SQLite runs it under its one write lock; on PostgreSQL the key's row is
locked first): concurrent requests of one key, on any tracker, cannot both
take the last share. A refused request drops the key's expired leases. A lease lasts
``MESHNET_KEY_LEASE_SECONDS`` and is renewed while its request runs
(:class:`KeyShare`); it is deleted on every way a request ends, and a
tracker that dies leaves its leases to expire.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from meshnet_site.database import database_call
from meshnet_site.errors import DomainError, ErrorKind
from tracker_app.models import ApiKey, KeyLease

logger = logging.getLogger(__name__)

# What a client refused for its key's share is told to wait (Retry-After): a
# request of its own has to end first, and a short chat takes about this long.
KEY_BUSY_RETRY_AFTER_SECONDS = 1


class KeyBusy(DomainError):
    """The API key already uses its whole share of requests or KV tokens in flight."""

    kind = ErrorKind.RATE_LIMITED


class TooManyRequestsInFlight(KeyBusy):
    code = "too_many_requests_in_flight"


class TooManyKvTokensInFlight(KeyBusy):
    code = "too_many_kv_tokens_in_flight"


class RequestOverKeyShare(DomainError):
    """One request reserving more KV tokens than its key may ever hold: waiting never helps."""

    kind = ErrorKind.INVALID
    code = "request_over_key_share"


@dataclass(frozen=True)
class KeyLimits:
    """How much one key may have in flight at once."""

    requests: int
    kv_tokens: int

    @classmethod
    def of(cls, api_key: ApiKey) -> KeyLimits:
        """The key's own limits where its admin fields set them, else the deployment's."""
        requests = api_key.max_requests_in_flight
        kv_tokens = api_key.max_kv_tokens_in_flight
        return cls(
            requests=settings.MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT if requests is None else requests,
            kv_tokens=settings.MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT
            if kv_tokens is None
            else kv_tokens,
        )


@dataclass(frozen=True)
class InFlight:
    """A key's requests in flight now and the KV tokens they reserve."""

    requests: int
    kv_tokens: int


def key_in_flight(*, api_key: ApiKey, now: datetime | None = None) -> InFlight:
    """What ``api_key`` has in flight now (its live leases)."""
    live = KeyLease.objects.filter(api_key=api_key, expires_at__gt=now or timezone.now())
    totals = live.aggregate(requests=Count("request_id"), kv_tokens=Sum("tokens"))
    return InFlight(requests=totals["requests"], kv_tokens=totals["kv_tokens"] or 0)


# One statement inserts the lease only within both limits, counting the key's live
# leases: atomic on SQLite (one writer, and a writing statement takes the lock before
# it reads); on PostgreSQL the key's row is locked first (see key_lease_take).
_TAKE = """
INSERT INTO {table} ({request_id}, {api_key_id}, {tokens}, {expires_at})
SELECT %s, %s, %s, %s
WHERE (SELECT COUNT(*) FROM {table} WHERE {api_key_id} = %s AND {expires_at} > %s) < %s
AND (SELECT COALESCE(SUM({tokens}), 0) FROM {table} WHERE {api_key_id} = %s AND {expires_at} > %s)
    + %s <= %s
"""


def _take_sql() -> str:
    quote = connection.ops.quote_name
    columns = {field.column: quote(field.column) for field in KeyLease._meta.concrete_fields}
    return _TAKE.format(table=quote(KeyLease._meta.db_table), **columns)


def key_lease_take(
    *, api_key: ApiKey, request_id: uuid.UUID, kv_tokens: int, now: datetime, seconds: float
) -> None:
    """Take a lease on ``api_key``'s share for one request reserving ``kv_tokens``.

    Raises :class:`TooManyRequestsInFlight` or :class:`TooManyKvTokensInFlight`
    (429) when the key's live leases leave no room, and
    :class:`RequestOverKeyShare` (400) when the request alone needs more than
    the key may ever reserve.
    """
    limits = KeyLimits.of(api_key)
    if kv_tokens > limits.kv_tokens:
        raise RequestOverKeyShare(
            f"This request reserves {kv_tokens} KV tokens ((prompt + max_tokens) × choices), "
            f"more than this API key's share of {limits.kv_tokens}; lower max_tokens or n",
            param="max_tokens",
        )
    adapt = connection.ops.adapt_datetimefield_value
    lease_id = KeyLease._meta.get_field("request_id").get_db_prep_value(request_id, connection)
    at, until = adapt(now), adapt(now + timedelta(seconds=seconds))
    params = [lease_id, api_key.pk, kv_tokens, until]
    params += [api_key.pk, at, limits.requests, api_key.pk, at, kv_tokens, limits.kv_tokens]
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.features.has_select_for_update:
            # Serialises the key's takes on PostgreSQL, whose statements read a snapshot.
            ApiKey.objects.select_for_update().filter(pk=api_key.pk).values_list("pk").first()
        cursor.execute(_take_sql(), params)
        if cursor.rowcount == 1:
            return
    _refuse(api_key=api_key, limits=limits, kv_tokens=kv_tokens, now=now)


def _refuse(*, api_key: ApiKey, limits: KeyLimits, kv_tokens: int, now: datetime) -> None:
    """Say which limit the key's live leases leave no room under (and drop its dead ones)."""
    KeyLease.objects.filter(api_key=api_key, expires_at__lte=now).delete()
    held = key_in_flight(api_key=api_key, now=now)
    if held.requests >= limits.requests:
        raise TooManyRequestsInFlight(
            f"This API key already has {held.requests} requests in flight, its limit; "
            "retry when one ends",
            retry_after=KEY_BUSY_RETRY_AFTER_SECONDS,
        )
    raise TooManyKvTokensInFlight(
        f"This API key's requests in flight reserve {held.kv_tokens} KV tokens; this one "
        f"needs {kv_tokens} more, past its limit of {limits.kv_tokens}; retry when one ends",
        retry_after=KEY_BUSY_RETRY_AFTER_SECONDS,
    )


def key_lease_renew(*, request_id: uuid.UUID, now: datetime, seconds: float) -> bool:
    """Extend the lease of a request still running; False if it is gone or expired (an
    expired lease is not revived: its share may have gone to another request)."""
    until = now + timedelta(seconds=seconds)
    live = KeyLease.objects.filter(request_id=request_id, expires_at__gt=now)
    return live.update(expires_at=until) == 1


def key_lease_release(*, request_id: uuid.UUID) -> None:
    """The request ended: its share is free (idempotent). Leases that expired (their
    tracker died) count for nothing; a refusal deletes its key's."""
    KeyLease.objects.filter(request_id=request_id).delete()


class KeyShare:
    """One request's lease on its key's share: :meth:`take`, renewed in the background
    while held, :meth:`release` on every way the request ends (idempotent)."""

    def __init__(self, *, api_key: ApiKey, request_id: uuid.UUID, seconds: float) -> None:
        self.api_key, self.request_id, self.seconds = api_key, request_id, seconds
        self._renewal: asyncio.Task[None] | None = None
        self._held = False

    async def take(self, *, kv_tokens: int) -> None:
        """Take the lease (raises :class:`KeyBusy` or :class:`RequestOverKeyShare`)."""
        self.claim()
        await database_call(self.take_here)(kv_tokens=kv_tokens)
        self.held()

    def claim(self) -> None:
        """The lease counts as held from now on, before it is written: a request cancelled
        while the row is written still deletes it on release (deleting a row never
        written is harmless)."""
        self._held = True

    def take_here(self, *, kv_tokens: int) -> None:
        """Write the lease, on this (database) thread, after :meth:`claim`; a refusal
        (:class:`KeyBusy`, :class:`RequestOverKeyShare`) wrote nothing and holds nothing."""
        try:
            key_lease_take(
                api_key=self.api_key,
                request_id=self.request_id,
                kv_tokens=kv_tokens,
                now=timezone.now(),
                seconds=self.seconds,
            )
        except DomainError:
            self._held = False
            raise

    def held(self) -> None:
        """The lease is written: renew it in the background while it is held (on the
        event loop)."""
        if self._held and self._renewal is None:
            self._renewal = asyncio.create_task(self._renew())

    async def release(self) -> None:
        if not self._held:
            return
        self._let_go()
        try:
            await database_call(key_lease_release)(request_id=self.request_id)
        except Exception:  # the lease expires on its own within its seconds
            logger.warning(
                "request %s: its key's lease could not be released", self.request_id, exc_info=True
            )

    def release_here(self) -> None:
        """:meth:`release` on this (database) thread, where a failure raises."""
        if self._held:
            key_lease_release(request_id=self.request_id)
            self._held = False

    def released(self) -> None:
        """A database call (:meth:`release_here`'s) deleted the lease: stop renewing it
        (on the event loop)."""
        self._let_go()

    def _let_go(self) -> None:
        self._held = False
        if self._renewal is not None:
            self._renewal.cancel()
            self._renewal = None

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.seconds / 3)
            try:
                await database_call(key_lease_renew)(
                    request_id=self.request_id, now=timezone.now(), seconds=self.seconds
                )
            except Exception:  # a blip: the next renewal tries again, well within the lease
                logger.warning(
                    "request %s: its key's lease could not be renewed",
                    self.request_id,
                    exc_info=True,
                )
