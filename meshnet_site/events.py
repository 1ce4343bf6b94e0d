"""The one event bus for live dashboard updates.

Anything that changes what an operator sees calls :func:`publish` (from sync
code: services, tasks) or :func:`publish_async` (from a coroutine) with a
message *kind* and a JSON-ready payload. Every dashboard websocket of every
tracker that shares the channel layer receives it as
``{"type": kind, **payload}``: the in-memory layer reaches the dashboards of
this process, ``channels_redis`` those of every tracker.

This module knows the channel layer and the group name, nothing about nodes,
routes or requests. Publishing is best effort: a layer that is down (Redis
away) costs the dashboards this update, never the caller its work.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer

logger = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"
# The channel-layer message type; Channels dispatches it to ``dashboard_event``.
EVENT_TYPE = "dashboard.event"

# Publishes scheduled from sync code running on an event loop's thread: kept
# here until done, because the loop holds only weak references to tasks.
_scheduled: set[asyncio.Task[None]] = set()


async def dashboards_watching() -> bool:
    """Whether any dashboard of any tracker sharing the channel layer is subscribed now.

    For updates that cost work to build (a record read back, a table): a
    dashboard that subscribes later takes its own snapshot, so an update
    nobody receives need not be built. The in-memory layer knows its group;
    Redis says how many subscribers the group's channel has (``PUBSUB
    NUMSUB``: one round trip). When that cannot be asked, the answer is yes.
    """
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        if isinstance(layer, InMemoryChannelLayer):
            return bool(layer.groups.get(DASHBOARD_GROUP))
        if isinstance(layer, RedisPubSubChannelLayer):
            return await _redis_subscribers(layer) > 0
    except Exception:  # best effort: build the update, as if watched
        logger.debug("could not ask whether dashboards watch", exc_info=True)
    return True


async def _redis_subscribers(layer: RedisPubSubChannelLayer) -> int:
    """Subscribers of the dashboard group's pub/sub channel (channels_redis's own names)."""
    loop_layer = layer._get_layer()
    channel = loop_layer._get_group_channel_name(DASHBOARD_GROUP)
    shard = loop_layer._get_shard(channel)
    async with shard._lock:
        shard._ensure_redis()
        counts = await shard._redis.pubsub_numsub(channel)
    return int(sum(count for _, count in counts))


async def publish_async(kind: str, payload: dict[str, Any]) -> None:
    """Send ``payload`` as a ``kind`` message to every dashboard; never raises."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(
            DASHBOARD_GROUP, {"type": EVENT_TYPE, "kind": kind, "payload": payload}
        )
    except Exception:  # best effort: the dashboards miss one update, the caller goes on
        logger.warning("could not push a %r update to the dashboards", kind, exc_info=True)


def publish(kind: str, payload: dict[str, Any]) -> None:
    """:func:`publish_async` for sync callers; never raises.

    From a worker thread (a Django view under ASGI, a Celery task) it sends
    before returning. Called on a thread that runs an event loop, where it
    cannot block, it schedules the send on that loop instead.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        task = loop.create_task(publish_async(kind, payload))
        _scheduled.add(task)
        task.add_done_callback(_scheduled.discard)
        return
    try:
        async_to_sync(publish_async)(kind, payload)
    except Exception:  # e.g. no loop can be started here: the update is lost, not the work
        logger.warning("could not push a %r update to the dashboards", kind, exc_info=True)
