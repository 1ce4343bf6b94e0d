"""The dashboard's websocket: the Call wall on connect, then every console event."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from tracker_app.console import DASHBOARD_GROUP, call_wall


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    """Staff only. Sends ``{"type": "call_wall", ...}`` once, then ``{"type": "event", ...}``."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_staff:
            await self.close(code=4403)
            return
        await self.channel_layer.group_add(DASHBOARD_GROUP, self.channel_name)
        await self.accept()
        await self.send_json({"type": "call_wall", **call_wall()})

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)

    async def console_event(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "event", "event": message["event"]})
