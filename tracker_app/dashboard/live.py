"""What the tracker pushes to the dashboards after a request finishes, throttled.

When a request finishes (``console.call_finished``) its record is read back
and pushed as a ``call`` message with the authoritative state (cancelled
included) and the cost; the model's routing table is pushed as a
``routing`` message, and after a completion the billing summary as a
``billing`` message. None of this is built while no dashboard of any tracker
watches (``meshnet_site.events.dashboards_watching``).

Tables are throttled per key: at most one push per ``interval`` seconds,
and always a trailing one, built when it is sent, so the latest state
arrives however many requests finish within the interval (a burst of
completions sends one or two tables, never one each).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from django.dispatch import receiver

from meshnet_site.events import dashboards_watching, publish_async
from tracker_app.completions import console
from tracker_app.dashboard import snapshot as dashboard

logger = logging.getLogger(__name__)

ROUTING = "routing"
BILLING = "billing"
PUSH_INTERVAL_SECONDS = 0.5

Clock = Callable[[], float]


class Throttle:
    """Runs ``action(key)`` at most once per ``interval`` seconds per key, trailing edge.

    :meth:`request` never waits. The first request after a quiet interval
    runs at once; later ones within the interval are folded into one run at
    the interval's end. A request that arrives while a run is under way
    schedules another, so no change is ever missed. Needs a running loop.
    """

    def __init__(
        self,
        action: Callable[[str], Awaitable[None]],
        *,
        interval: float = PUSH_INTERVAL_SECONDS,
        clock: Clock = time.monotonic,
    ) -> None:
        self.action = action
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}
        self._pending: dict[str, asyncio.Task[None]] = {}

    def request(self, key: str) -> None:
        loop = asyncio.get_running_loop()
        pending = self._pending.get(key)
        if pending is not None and not pending.done() and pending.get_loop() is loop:
            return
        last = self._last.get(key)
        delay = 0.0 if last is None else max(0.0, last + self.interval - self.clock())
        self._pending[key] = loop.create_task(self._run(key, delay))

    async def _run(self, key: str, delay: float) -> None:
        await asyncio.sleep(delay)
        # From here on a new request schedules a new run: this one may have
        # read the state already.
        self._pending.pop(key, None)
        self._last[key] = self.clock()
        try:
            await self.action(key)
        except Exception:  # a failed push must not stop later ones
            logger.warning("dashboard push for %r failed", key, exc_info=True)


async def _push_routing(model_key: str) -> None:
    section = await database_sync_to_async(dashboard.routing_section)(model_key=model_key)
    for model in section["models"]:
        await publish_async(ROUTING, {"config": section["config"], "model": model})


async def _push_billing(_: str) -> None:
    await publish_async(BILLING, await database_sync_to_async(dashboard.billing_summary)())


routing_pushes = Throttle(_push_routing)
billing_pushes = Throttle(_push_billing)


def routing_refresh(model_key: str) -> None:
    """Push ``model_key``'s routing table soon (throttled); call from the event loop."""
    routing_pushes.request(model_key)


async def _push_call_record(request_id: str) -> None:
    try:
        call = await database_sync_to_async(dashboard.call_record)(request_id=request_id)
    except Exception:  # the Call wall keeps what the console said; only the cost is missing
        logger.warning(
            "could not read request %s back for the dashboards", request_id, exc_info=True
        )
        return
    if call is not None:
        await publish_async(console.CALL, {"call": call})


# Each finished request's record push, kept referenced until done.
_record_pushes: set[asyncio.Task[None]] = set()


@receiver(console.call_finished)
async def on_call_finished(sender: Any, *, call: dict[str, Any], **kwargs: Any) -> None:
    """Schedule the pushes a finished request causes; returns at once."""
    task = asyncio.get_running_loop().create_task(_after_finished(call))
    _record_pushes.add(task)
    task.add_done_callback(_record_pushes.discard)


async def _after_finished(call: dict[str, Any]) -> None:
    """The request's record, the model's routing table and the billing summary, pushed
    only while some dashboard watches: one that connects later takes its own snapshot,
    and building them (database reads that grow with the ledger) is most of what a
    request would otherwise cost the tracker after its answer."""
    if not await dashboards_watching():
        return
    if call.get("model"):
        routing_refresh(call["model"])
    if call["state"] == console.COMPLETED:
        billing_pushes.request("all")
    await _push_call_record(call["request_id"])
