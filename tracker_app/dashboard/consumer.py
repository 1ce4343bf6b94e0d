"""The dashboard's websocket (``/ws/dashboard/``): a snapshot, then pushed updates."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from meshnet_site.events import DASHBOARD_GROUP
from nodes_app.events import EPOCH
from tracker_app.dashboard.live import routing_refresh
from tracker_app.dashboard.snapshot import dashboard_snapshot

RESYNC = "resync"
SNAPSHOT = "snapshot"


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    """Live feed of the dashboard for staff; any other socket is refused (handshake 403).

    Every message is a JSON object whose ``type`` says what it carries:

    - ``snapshot``: sent on connect and when the page sends ``{"type": "resync"}``:
      ``server_time``, ``heartbeat_timeout``, ``models`` (nodes and coverage
      per model), ``routing`` (``/v1/routing`` plus each model's tok/s
      ``series``), ``calls`` (``in_flight``, ``recent``) and ``billing``; see
      ``tracker_app.dashboard.snapshot.dashboard_snapshot``;
    - ``node``: ``{"node": row}``, one node joined, left, went offline or changed load;
    - ``epoch``: ``{"model", "epoch", "reason"}``, a model's topology changed;
    - ``routing``: ``{"config", "model"}``, one model's routing table and series
      (at most one per model per half second);
    - ``call``: ``{"call", "event"?}``, one request's summary after a proxy event
      (then once more with its cost when it finished);
    - ``billing``: the billing summary after a completion (throttled like routing).

    Updates are idempotent upserts: after a dropped socket the page reconnects
    and starts again from a fresh snapshot.
    """

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not (user.is_active and user.is_staff):
            await self.close(code=4403)
            return
        # Join first: an update that races with the snapshot arrives after it.
        await self.channel_layer.group_add(DASHBOARD_GROUP, self.channel_name)
        await self.accept()
        await self._send_snapshot()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == RESYNC:
            await self._send_snapshot()

    async def dashboard_event(self, message: dict[str, Any]) -> None:
        kind, payload = message["kind"], message["payload"]
        if kind == EPOCH:
            # The registry (maybe another process) cannot build this tracker's table.
            routing_refresh(payload["model"])
        await self.send_json({"type": kind, **payload})

    async def _send_snapshot(self) -> None:
        snapshot = await database_sync_to_async(dashboard_snapshot)()
        await self.send_json({"type": SNAPSHOT, **snapshot})
