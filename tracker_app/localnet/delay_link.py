"""A TCP link with a given one-way delay: a slow link between hosts, on one machine.

:class:`DelayLink` listens on ``host:port`` and relays every connection to its
target, holding each chunk of bytes ``one_way_ms`` before passing it on, in
both directions: a request and its answer cost one round trip of
``2 × one_way_ms`` more than without it. Bandwidth is not limited and order is
kept; only latency is added (what netem's ``delay`` does, where a kernel has no
netem). A node that advertises the link's URL is reached through it by the
tracker (its endpoint proof too) and by the head before it on a route.

It runs its own event loop on a daemon thread, so tests and benchmarks use it
from plain synchronous code::

    with DelayLink((LOOPBACK, tail_port), one_way_ms=20) as link:
        ... start the tail with --advertise link.url ...
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType
from typing import Self

from tracker_app.localnet.processes import LOOPBACK

_CHUNK = 65536


class DelayLink:
    """Relay ``host:port`` (a free port when 0) to ``target``, each direction ``one_way_ms``
    late; a context manager. ``connections`` counts the connections it relayed."""

    def __init__(
        self, target: tuple[str, int], *, one_way_ms: float, host: str = LOOPBACK, port: int = 0
    ) -> None:
        if one_way_ms < 0:
            raise ValueError(f"a delay cannot be negative, got {one_way_ms} ms")
        self.target = target
        self.delay = one_way_ms / 1000
        self.host = host
        self.port = port
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="delay-link", daemon=True
        )
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()
        self._ends: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        """``http://host:port`` of the link (once entered): what a node behind it advertises."""
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, self.host, self.port), self._loop
        )
        self._server = server.result(timeout=10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _close(self) -> None:
        """Stop listening, reset every relayed connection and wait for their relays to end."""
        if self._server is not None:
            self._server.close()
        for end in list(self._ends):
            end.transport.abort()
        if self._relays:
            await asyncio.wait(self._relays, timeout=5)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        relay = asyncio.current_task()
        assert relay is not None
        self._relays.add(relay)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()  # the target is down: the caller sees a reset
            self._relays.discard(relay)
            return
        self.connections += 1
        ends = (writer, upstream_writer)
        self._ends.update(ends)
        try:
            await asyncio.gather(
                self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer)
            )
        finally:
            for end in ends:
                end.transport.abort()
                self._ends.discard(end)
            self._relays.discard(relay)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer``, each chunk delivered ``delay`` after it was read.

        Reading goes on while earlier chunks wait, so the delay is added once,
        not once per chunk in flight. An end of stream travels as late as the data.
        """
        loop = asyncio.get_running_loop()
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                at, data = await due.get()
                if (wait := at - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        delivering = asyncio.create_task(deliver())
        try:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await reader.read(_CHUNK):
                    due.put_nowait((loop.time() + self.delay, data))
            due.put_nowait((loop.time() + self.delay, b""))
            with contextlib.suppress(ConnectionError, OSError):
                await delivering
        finally:
            delivering.cancel()
