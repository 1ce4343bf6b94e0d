"""The tracker's console: a bounded ring of proxy events, pushed live to the dashboard.

Each event is kept in an in-memory ring (the Call wall's source) and sent to
the ``dashboard`` channel group. ``proxy progress`` events are updated in
place: a request has at most one progress entry, rewritten as tokens arrive,
so a long generation never floods the ring.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"
RING_SIZE = 500

ROUTE_SELECTED = "proxy route selected"
CONNECTED = "proxy connected"
PROGRESS = "proxy progress"
COMPLETE = "proxy complete"
ERROR = "proxy error"
FINISHED = frozenset({COMPLETE, ERROR})


@dataclass
class ConsoleEvent:
    kind: str
    request_id: str
    data: dict[str, Any]
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ConsoleRing:
    """The newest ``size`` events, oldest first; progress entries replaced in place."""

    def __init__(self, size: int = RING_SIZE) -> None:
        self.size = size
        self._events: OrderedDict[tuple[str, str, int], ConsoleEvent] = OrderedDict()
        self._serial = 0
        self._lock = threading.Lock()

    def add(self, event: ConsoleEvent) -> None:
        with self._lock:
            if event.kind == PROGRESS:
                key = (event.request_id, PROGRESS, 0)
                if key in self._events:
                    self._events[key] = event  # keeps its place: updated in place
                    return
            else:
                self._serial += 1
                key = (event.request_id, event.kind, self._serial)
            self._events[key] = event
            while len(self._events) > self.size:
                self._events.popitem(last=False)

    def events(self) -> list[ConsoleEvent]:
        with self._lock:
            return list(self._events.values())


_ring = ConsoleRing()


async def console_emit(kind: str, request_id: str, **data: Any) -> ConsoleEvent:
    """Record an event and push it to every dashboard connected to any tracker.

    Best effort: a channel layer that is down (Redis away) costs the dashboards
    this event, never the request that emitted it.
    """
    event = ConsoleEvent(kind=kind, request_id=request_id, data=data)
    _ring.add(event)
    layer = get_channel_layer()
    if layer is not None:
        try:
            await layer.group_send(
                DASHBOARD_GROUP, {"type": "console.event", "event": event.to_dict()}
            )
        except Exception:
            logger.warning("could not push %r to the dashboards", kind, exc_info=True)
    return event


def call_wall(ring: ConsoleRing | None = None, *, recent: int = 20) -> dict[str, Any]:
    """The Call wall: in-flight requests with live progress, then the latest finished.

    Each request is summarised from its events: route and mode from
    ``proxy route selected``, tokens and tokens/s from the latest progress,
    the outcome from ``proxy complete`` or ``proxy error``.
    """
    calls: dict[str, dict[str, Any]] = {}
    for event in (ring or _ring).events():
        call = calls.setdefault(
            event.request_id,
            {"request_id": event.request_id, "state": "processing", "started_at": event.at},
        )
        call["updated_at"] = event.at
        if event.kind == ROUTE_SELECTED:
            call.update(route=event.data.get("signature"), mode=event.data.get("mode"))
            call.update(model=event.data.get("model"))
        elif event.kind == PROGRESS:
            for name in ("tokens", "tokens_per_second", "queue"):
                call[name] = event.data.get(name)
        elif event.kind == COMPLETE:
            call.update(state="complete", **event.data)
        elif event.kind == ERROR:
            call.update(state="error", error=event.data.get("message"))
    in_flight = [c for c in calls.values() if c["state"] == "processing"]
    finished = [c for c in calls.values() if c["state"] != "processing"]
    finished.sort(key=lambda c: c["updated_at"], reverse=True)
    return {"in_flight": in_flight, "recent": finished[:recent]}
