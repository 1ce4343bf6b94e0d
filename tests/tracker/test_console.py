"""The console ring, the Call wall and their live push to the dashboard websocket."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from channels.testing import WebsocketCommunicator

from tracker_app import console
from tracker_app.console import ConsoleEvent, ConsoleRing, call_wall
from tracker_app.consumers import DashboardConsumer


def event(kind: str, request_id: str, **data: Any) -> ConsoleEvent:
    return ConsoleEvent(kind=kind, request_id=request_id, data=data)


def test_progress_is_updated_in_place_and_the_ring_stays_bounded() -> None:
    ring = ConsoleRing(size=3)
    ring.add(event(console.ROUTE_SELECTED, "r1", mode="scout", signature="s"))
    for tokens in range(1, 50):
        ring.add(event(console.PROGRESS, "r1", tokens=tokens))

    assert [e.kind for e in ring.events()] == [console.ROUTE_SELECTED, console.PROGRESS]
    assert ring.events()[-1].data["tokens"] == 49

    for n in range(5):
        ring.add(event(console.COMPLETE, f"other-{n}"))
    assert len(ring.events()) == 3


def test_the_call_wall_shows_in_flight_requests_live_and_the_finished_ones() -> None:
    ring = ConsoleRing()
    ring.add(event(console.ROUTE_SELECTED, "busy", mode="exploit", signature="m | a[0-3]"))
    ring.add(event(console.CONNECTED, "busy"))
    ring.add(event(console.PROGRESS, "busy", tokens=12, tokens_per_second=15.0, queue=0))
    ring.add(event(console.ROUTE_SELECTED, "done", mode="scout", signature="m | b[0-3]"))
    ring.add(event(console.COMPLETE, "done", completion_tokens=30))
    ring.add(event(console.ROUTE_SELECTED, "broken", mode="pinned", signature="m | c[0-3]"))
    ring.add(event(console.ERROR, "broken", message="hop c failed"))

    wall = call_wall(ring)

    [busy] = wall["in_flight"]
    assert busy["request_id"] == "busy" and busy["state"] == "processing"
    assert (busy["tokens"], busy["tokens_per_second"], busy["mode"]) == (12, 15.0, "exploit")
    assert [c["request_id"] for c in wall["recent"]] == ["broken", "done"]
    assert wall["recent"][0]["error"] == "hop c failed"
    assert wall["recent"][1]["completion_tokens"] == 30


def staff_scope() -> dict[str, Any]:
    return {"user": SimpleNamespace(is_staff=True)}


def test_a_staff_dashboard_gets_the_call_wall_then_live_events() -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        communicator = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
        communicator.scope.update(staff_scope())
        connected, _ = await communicator.connect()
        assert connected
        try:
            first = await communicator.receive_json_from(timeout=5)
            await console.console_emit(console.PROGRESS, "req-9", tokens=3, tokens_per_second=9.5)
            second = await communicator.receive_json_from(timeout=5)
        finally:
            await communicator.disconnect()
        return first, second

    first, second = asyncio.run(scenario())

    assert first["type"] == "call_wall" and "in_flight" in first
    assert second["type"] == "event"
    assert second["event"]["kind"] == "proxy progress"
    assert second["event"]["data"] == {"tokens": 3, "tokens_per_second": 9.5}


def test_an_anonymous_websocket_is_refused() -> None:
    async def scenario() -> bool:
        communicator = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
        communicator.scope["user"] = SimpleNamespace(is_staff=False)
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return bool(connected)

    assert asyncio.run(scenario()) is False
