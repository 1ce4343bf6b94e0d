"""Writing to and claiming from the outbox (see the package docstring)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from meshnet_site.outbox.models import OutboxMessage

# A dashboard event nobody forwarded for this long (no tracker was running)
# describes a past the dashboards no longer show: it is dropped, not sent.
STALE_AFTER = timedelta(minutes=10)


def outbox_put(*, kind: str, subject: str = "", payload: dict[str, Any] | None = None) -> None:
    """Queue a dashboard event; it commits or rolls back with the caller's transaction.

    So a job's event is announced exactly when its effect is: a rolled-back
    quarantine is never shown.
    """
    OutboxMessage.objects.create(kind=kind, subject=subject[:2000], payload=payload or {})


def outbox_claim(*, now: datetime, limit: int = 100) -> list[OutboxMessage]:
    """Take up to ``limit`` messages, oldest first, and delete them: each is claimed once.

    Several trackers may claim at once: rows another transaction holds are
    skipped (PostgreSQL), or the claims run one after the other (SQLite's
    write lock), so no message is forwarded twice. Messages older than
    ``STALE_AFTER`` are deleted without being returned.
    """
    # A plain read first: an idle relay never takes the write lock (SQLite
    # has one for the whole database, which registrations and syncs need).
    if not OutboxMessage.objects.exists():
        return []
    with transaction.atomic():
        OutboxMessage.objects.filter(created_at__lt=now - STALE_AFTER).delete()
        claimed = list(
            OutboxMessage.objects.select_for_update(skip_locked=True).order_by("id")[:limit]
        )
        if claimed:
            OutboxMessage.objects.filter(pk__in=[message.pk for message in claimed]).delete()
    return claimed
