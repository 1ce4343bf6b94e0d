"""The dashboard event bus: typed messages to the dashboard group, never an error to the caller."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer

from meshnet_site import events


class BrokenLayer:
    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        raise ConnectionError("redis is away")


@pytest.fixture
def layer(monkeypatch: pytest.MonkeyPatch) -> InMemoryChannelLayer:
    layer = InMemoryChannelLayer()
    monkeypatch.setattr(events, "get_channel_layer", lambda: layer)
    return layer


def test_a_published_update_reaches_the_dashboard_group_with_its_kind(
    layer: InMemoryChannelLayer,
) -> None:
    async def scenario() -> dict[str, Any]:
        await layer.group_add(events.DASHBOARD_GROUP, "dashboard-1")
        await events.publish_async("epoch", {"model": "m", "epoch": 3})
        return await layer.receive("dashboard-1")

    message = asyncio.run(scenario())

    assert message == {
        "type": "dashboard.event",
        "kind": "epoch",
        "payload": {"model": "m", "epoch": 3},
    }


def test_publishing_from_sync_code_on_an_event_loop_schedules_instead_of_blocking(
    layer: InMemoryChannelLayer,
) -> None:
    async def scenario() -> dict[str, Any]:
        await layer.group_add(events.DASHBOARD_GROUP, "dashboard-1")
        events.publish("node", {"node": {"id": "n1"}})  # sync call, loop running
        return await asyncio.wait_for(layer.receive("dashboard-1"), 2)

    assert asyncio.run(scenario())["payload"] == {"node": {"id": "n1"}}


def test_publishing_from_a_plain_thread_sends_before_returning(
    layer: InMemoryChannelLayer,
) -> None:
    async def add() -> None:
        await layer.group_add(events.DASHBOARD_GROUP, "dashboard-1")

    asyncio.run(add())
    events.publish("call", {"call": {"request_id": "r"}})

    message = asyncio.run(layer.receive("dashboard-1"))
    assert message["kind"] == "call"


def test_a_layer_that_is_down_never_fails_the_publisher(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(events, "get_channel_layer", lambda: BrokenLayer())

    events.publish("node", {"node": {}})
    asyncio.run(events.publish_async("node", {"node": {}}))

    assert "could not push a 'node' update" in caplog.text
