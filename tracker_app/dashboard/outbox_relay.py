"""The tracker's side of the outbox: claim what background jobs wrote, push it live.

``outbox_relay_start()`` runs on the tracker's event loop (``runtracker``
starts it once daphne's loop exists), so it reaches the dashboards through
the same channel layer as the chat proxy's own events, in-memory or Redis.
Every tracker runs one; each message is claimed, and so forwarded, once.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from django.utils import timezone

from meshnet_site.events import publish_async
from meshnet_site.outbox.models import OutboxMessage
from meshnet_site.outbox.services import outbox_claim
from routing_app.exclusions.quarantines import (
    ROUTE_QUARANTINED,
    ROUTE_RELEASED,
    route_quarantines_active,
)
from routing_app.learning.tracker_store import route_stats_store
from tracker_app.billing.audits import REFUND
from tracker_app.dashboard.live import billing_pushes, routing_refresh

logger = logging.getLogger(__name__)

RELAY_INTERVAL_SECONDS = 1.0

_relay: asyncio.Task[None] | None = None


async def outbox_forward(message: OutboxMessage) -> None:
    """Push one outbox message to the dashboards: the one call to the dashboard bus.

    A route the probe quarantined or released is taken into this tracker's
    routing at once (not at its next sync), so the table pushed with it shows it.
    """
    if message.kind in (ROUTE_QUARANTINED, ROUTE_RELEASED):
        quarantined = await database_sync_to_async(route_quarantines_active)()
        route_stats_store().exclusions.set_probe_quarantines(quarantined)
        routing_refresh(str(message.payload.get("model", "")))
    if message.kind == REFUND:
        billing_pushes.request("all")
    await publish_async(message.kind, message.payload)


async def outbox_relay_once(*, limit: int = 100) -> int:
    """Claim and forward the waiting messages, oldest first; how many were forwarded."""
    messages = await database_sync_to_async(outbox_claim)(now=timezone.now(), limit=limit)
    for message in messages:
        await outbox_forward(message)
    return len(messages)


async def outbox_relay(*, interval: float = RELAY_INTERVAL_SECONDS) -> None:
    """Relay forever; a failed round (database busy or away) is logged and retried."""
    while True:
        try:
            while await outbox_relay_once() > 0:
                pass
        except Exception:
            logger.warning("outbox relay round failed", exc_info=True)
        await asyncio.sleep(interval)


def outbox_relay_start(loop: asyncio.AbstractEventLoop) -> asyncio.Task[None]:
    """Start the relay on ``loop`` (once per process; later calls return the same task)."""
    global _relay
    if _relay is None or _relay.done():
        _relay = loop.create_task(outbox_relay())
    return _relay
