"""A request's live progress, pushed to the dashboards at most once per interval.

The proxy sees every token; the dashboards need a few updates a second per
request. Pushing one per token would put a channel-layer send (a Redis round
trip with ``REDIS_URL``) and a console fold on the tracker's hot path for
every token of every stream. :class:`ProgressThrottle` instead sends the
latest state at most once per ``interval``:

- leading edge: the first change after a quiet interval is sent at once, so a
  request shows progress as soon as its first token arrives;
- trailing edge: changes within the interval are folded into one send at its
  end, so a stream that pauses (or a burst of tokens) still shows its latest
  count, not the one from the start of the burst;
- the caller sends the final state itself (``proxy complete`` carries the
  exact count) after :meth:`ProgressThrottle.close`, which stops the sends
  and, when asked, flushes a change not sent yet (a failed request).

Per token the proxy only calls :meth:`ProgressThrottle.changed`: setting an
``asyncio.Event``. The sends run in one task per request, off the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


class ProgressThrottle:
    """Call ``report`` at most once per ``interval`` seconds after :meth:`changed`.

    ``report`` reads the current state itself when it runs, so what it sends
    is always the latest. It must not raise (the console's emit is best effort).
    """

    def __init__(self, *, interval: float, report: Callable[[], Awaitable[None]]) -> None:
        self.interval = interval
        self._report = report
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def changed(self) -> None:
        """The state changed: it is sent now, or at the end of the current interval."""
        if self._closed:
            return
        self._changed.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def close(self, *, flush: bool = False) -> None:
        """Stop sending; with ``flush``, send a change the interval still held back."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if flush and self._changed.is_set():
            self._changed.clear()
            await self._report()

    def cancel(self) -> None:
        """Stop sending at once, without waiting (a request torn down by its client)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            await self._report()
            await asyncio.sleep(self.interval)
