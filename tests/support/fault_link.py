"""A TCP link between a process and a server that a test can break: a real fault injector.

:class:`FaultyLink` listens on a loopback port and relays every connection to
its target (PostgreSQL, say). :meth:`FaultyLink.cut` resets every relayed
connection at once and refuses new ones (each is reset as soon as it is
accepted), as a server that went away would; :meth:`FaultyLink.restore`
relays again. It runs its own event loop on a daemon thread, so tests call
it from plain synchronous code.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit

from tracker_app.localnet import LOOPBACK

_CHUNK = 65536
T = TypeVar("T")


class FaultyLink:
    """Relay ``LOOPBACK:port`` to ``target_host:target_port`` until told to fail."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.refused = 0  # connections reset on arrival while the link was cut
        self._down = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @classmethod
    def to_url(cls, url: str, default_port: int = 5432) -> Self:
        """A link to the server a URL names (``postgres://user@host:port/db``)."""
        parts = urlsplit(url)
        return cls(parts.hostname or LOOPBACK, parts.port or default_port)

    def url_for(self, url: str) -> str:
        """``url`` with its server replaced by this link (start the link first)."""
        parts = urlsplit(url)
        user = f"{parts.username}@" if parts.username else ""
        if parts.password:
            user = f"{parts.username}:{parts.password}@"
        return parts._replace(netloc=f"{user}{LOOPBACK}:{self.port}").geturl()

    def __enter__(self) -> FaultyLink:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._relay, LOOPBACK, 0))
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def cut(self) -> None:
        """Reset every relayed connection now and every new one until :meth:`restore`."""
        self._call(self._cut())

    def restore(self) -> None:
        """Relay new connections again."""
        self._down = False

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """Cut for the ``with`` block, restored after (even when the block fails)."""
        self.cut()
        try:
            yield
        finally:
            self.restore()

    def _call(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=10)

    async def _cut(self) -> None:
        self._down = True
        for writer in list(self._writers):
            writer.transport.abort()  # RST, not an orderly close: the peer sees a reset
        self._writers.clear()

    async def _close(self) -> None:
        await self._cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._down:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, upstream_writer))
        try:
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        finally:
            for end in (writer, upstream_writer):
                self._writers.discard(end)
                end.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until either end closes or is reset."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    if not writer.transport.is_closing():
        writer.transport.abort()
