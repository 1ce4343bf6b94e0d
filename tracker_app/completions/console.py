"""The tracker's console: what the chat proxy reports, kept in memory and pushed live.

The proxy calls :func:`console_emit` at each step of a request (route
selected, connected, progress, complete or error). Each event is

- kept in a bounded ring (``proxy progress`` updated in place, so a long
  generation never floods it);
- folded into the request's *call*: one summary per request (route, mode,
  tokens so far, tokens/s, state) that the Call wall shows;
- on completion, added to the route's tokens/s series (the Routing chart);
- pushed to every dashboard as a ``call`` message (``meshnet_site.events``).

When a request finishes, :data:`call_finished` is sent (``tracker_app.dashboard.live``
listens: it pushes the request's cost and the model's new routing table).
Everything here is per tracker process and in memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from django.dispatch import Signal

from meshnet_site.events import publish_async
from routing_app.policies.config import RoutePolicyConfig

logger = logging.getLogger(__name__)

RING_SIZE = 500
CALLS_KEPT = 200
SERIES_WINDOW_SECONDS = 600.0
SERIES_MAX_POINTS = 240

ROUTE_SELECTED = "proxy route selected"
CONNECTED = "proxy connected"
PROGRESS = "proxy progress"
COMPLETE = "proxy complete"
ERROR = "proxy error"
FINISHED = frozenset({COMPLETE, ERROR})

# The dashboard message kind of a console event.
CALL = "call"

PROCESSING = "processing"
COMPLETED = "completed"
FAILED = "failed"

# Sent (``asend``) after a request's last event, with ``call`` (its summary).
call_finished = Signal()


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


class CallBook:
    """One summary per request, folded from its events as they arrive.

    A summary holds ``request_id``, ``state`` (processing, completed,
    failed), ``model``, ``api`` (the API it came through), ``route``, ``mode``, ``tokens``,
    ``tokens_per_second``, ``queue``, ``started_at``, ``updated_at`` and,
    once finished, ``finished_at`` with ``finish_reason`` or ``error``. A
    finished request never goes back to processing. At most ``size``
    requests are kept; the oldest finished ones go first.
    """

    def __init__(self, size: int = CALLS_KEPT) -> None:
        self.size = size
        self._calls: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def apply(self, event: ConsoleEvent) -> dict[str, Any]:
        """Fold ``event`` into its request's summary; returns a copy of the summary."""
        with self._lock:
            call = self._calls.get(event.request_id)
            if call is None:
                call = self._calls[event.request_id] = {
                    "request_id": event.request_id,
                    "state": PROCESSING,
                    "model": None,
                    "route": None,
                    "mode": None,
                    "api": None,
                    "tokens": 0,
                    "tokens_per_second": None,
                    "queue": None,
                    "started_at": event.at,
                }
                self._trim()
            _fold(call, event)
            return dict(call)

    def in_flight(self) -> list[dict[str, Any]]:
        """Requests still processing, oldest first."""
        with self._lock:
            return [dict(c) for c in self._calls.values() if c["state"] == PROCESSING]

    def finished(self, *, limit: int) -> list[dict[str, Any]]:
        """The latest finished requests, newest first."""
        with self._lock:
            done = [dict(c) for c in self._calls.values() if c["state"] != PROCESSING]
        done.sort(key=lambda c: c["updated_at"], reverse=True)
        return done[:limit]

    def _trim(self) -> None:
        while len(self._calls) > self.size:
            oldest_finished = next(
                (rid for rid, c in self._calls.items() if c["state"] != PROCESSING), None
            )
            if oldest_finished is None:
                self._calls.popitem(last=False)
            else:
                del self._calls[oldest_finished]


def _fold(call: dict[str, Any], event: ConsoleEvent) -> None:
    data = event.data
    finished = call["state"] != PROCESSING
    call["updated_at"] = event.at
    if event.kind == ROUTE_SELECTED and not finished:
        call.update(
            model=data.get("model"),
            route=data.get("signature"),
            mode=data.get("mode"),
            api=data.get("api"),
        )
    elif event.kind == PROGRESS and not finished:
        call.update(
            tokens=data.get("tokens", call["tokens"]),
            tokens_per_second=data.get("tokens_per_second"),
            queue=data.get("queue"),
        )
    elif event.kind == COMPLETE and not finished:
        call.update(
            state=COMPLETED,
            route=data.get("signature", call["route"]),
            tokens=data.get("completion_tokens", call["tokens"]),
            tokens_per_second=data.get("tokens_per_second"),
            finish_reason=data.get("finish_reason"),
            finished_at=event.at,
        )
    elif event.kind == ERROR and not finished:
        call.update(state=FAILED, error=data.get("message"), finished_at=event.at)


class RouteSeries:
    """Observed tokens/s of completed requests per (model, route) over the last minutes.

    Each point is ``[unix time, tokens/s]``; points older than ``window``
    seconds are dropped, and a route keeps at most ``max_points``.
    """

    def __init__(
        self,
        *,
        window: float = SERIES_WINDOW_SECONDS,
        max_points: int = SERIES_MAX_POINTS,
    ) -> None:
        self.window = window
        self.max_points = max_points
        self._points: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def record(
        self, *, model_key: str, signature: str, tokens_per_second: float, at: float
    ) -> None:
        with self._lock:
            points = self._points.setdefault((model_key, signature), deque(maxlen=self.max_points))
            points.append((at, tokens_per_second))

    def for_model(
        self, model_key: str, *, now: float | None = None
    ) -> dict[str, list[list[float]]]:
        """``{signature: [[time, tokens/s], …]}`` for the model's routes, oldest point first."""
        cutoff = (time.time() if now is None else now) - self.window
        with self._lock:
            for key in [key for key, points in self._points.items() if points[-1][0] < cutoff]:
                del self._points[key]
            return {
                signature: [[at, tps] for at, tps in points if at >= cutoff]
                for (model, signature), points in self._points.items()
                if model == model_key
            }


_ring = ConsoleRing()
_calls = CallBook()
route_series = RouteSeries()


async def console_emit(kind: str, request_id: str, **data: Any) -> ConsoleEvent:
    """Record an event and push the request's call to every dashboard of every tracker.

    Best effort: a channel layer that is down (Redis away) costs the dashboards
    this event, never the request that emitted it.
    """
    event = ConsoleEvent(kind=kind, request_id=request_id, data=data)
    if kind != PROGRESS:  # the operator's log: one line per event, not per token
        logger.info("request %s: %s%s", request_id, kind, _log_fields(data))
    _ring.add(event)
    call = _calls.apply(event)
    if kind == COMPLETE:
        _record_speed(call)
    await publish_async(CALL, {"event": event.to_dict(), "call": call})
    if kind in FINISHED:
        for receiver, outcome in await call_finished.asend_robust(sender=ConsoleEvent, call=call):
            if isinstance(outcome, Exception):
                logger.warning("%r failed on a finished call", receiver, exc_info=outcome)
    return event


def _log_fields(data: dict[str, Any]) -> str:
    """`` key=value`` for an event's scalar fields (the hops are in the signature)."""
    return "".join(
        f" {key}={value}"
        for key, value in data.items()
        if value is not None and not isinstance(value, list | dict)
    )


def _record_speed(call: dict[str, Any]) -> None:
    # Near-empty answers teach the router nothing (ADR-0020), so the chart skips them too.
    tps, model, route = call.get("tokens_per_second"), call.get("model"), call.get("route")
    if not tps or model is None or route is None:
        return
    if (call.get("tokens") or 0) < RoutePolicyConfig.from_settings().min_sample_tokens:
        return
    route_series.record(
        model_key=model, signature=route, tokens_per_second=float(tps), at=call["updated_at"]
    )


def calls_in_flight() -> list[dict[str, Any]]:
    """This tracker's requests still processing, with their live progress."""
    return _calls.in_flight()
