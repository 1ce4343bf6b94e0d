"""The tracker's connections to the head nodes: httpx's pool on lean asyncio sockets.

The proxy reads every token of every stream from a head's connection, so the
cost of one read is paid per relayed token. httpx's own network layer (anyio's
socket streams) pays, on each read, for a cancel scope (the read timeout),
resuming and pausing the socket's reading (two ``epoll_ctl`` calls) and an
event to wait on. :class:`AsyncioBackend` is httpcore's network interface
(``AsyncNetworkBackend``) on a plain asyncio protocol instead:

- the socket is read continuously into a buffer, paused only past
  :data:`READ_HIGH_WATER` unread bytes (a reader that falls behind), so a read
  of data already there returns it at once, and whatever arrived since the
  last read comes back in one;
- a read that has to wait arms at most one timer per connection, moved
  forward lazily, not one per read;
- its failures are httpcore's (``ReadTimeout``, ``ReadError``,
  ``ConnectTimeout``…), which httpx maps to its own as with any transport.

Everything above the socket stays httpx's and httpcore's: the pool, its
limits and keep-alive expiry, HTTP/1.1 (h11), the timeouts each request sets.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx
from httpcore import AsyncNetworkBackend, AsyncNetworkStream

# Unread bytes past which a connection stops reading its socket until they are read.
READ_HIGH_WATER = 256 * 1024


def upstream_transport(
    limits: httpx.Limits, *, verify: ssl.SSLContext | bool = True
) -> httpx.AsyncHTTPTransport:
    """httpx's transport with ``limits`` (and ``verify``, as httpx takes it), its
    connections on :class:`AsyncioBackend`."""
    transport = httpx.AsyncHTTPTransport(limits=limits, verify=verify)
    # The pool httpx would build, on this backend (httpx has no argument for it).
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=transport._pool._ssl_context,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        http1=True,
        http2=False,
        network_backend=AsyncioBackend(),
    )
    return transport


class _Connection(asyncio.Protocol):
    """One socket's received bytes, buffered until read, and its write flow control."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.unread = 0
        self.ended = False  # the peer closed its side, or the connection is lost
        self.error: Exception | None = None
        self.reader: asyncio.Future[None] | None = None
        self.writable: asyncio.Future[None] | None = None
        self.paused = False
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # asyncio's callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.unread += len(data)
        if self.unread > READ_HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        if self.writable is None or self.writable.done():
            self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def _wake(self) -> None:
        if self.reader is not None and not self.reader.done():
            self.reader.set_result(None)

    # the read timeout: one timer per connection, moved later only when it fires
    def _arm(self, timeout: float) -> None:
        self.deadline = self.loop.time() + timeout
        if self.timer is not None and self.timer.when() > self.deadline:
            self.timer.cancel()  # a shorter timeout than the one armed
            self.timer = None
        if self.timer is None:
            self.timer = self.loop.call_at(self.deadline, self._expire)

    def _expire(self) -> None:
        self.timer = None
        if self.reader is None or self.reader.done():
            return
        if self.loop.time() >= self.deadline:
            self.reader.set_exception(TimeoutError())
        else:
            self.timer = self.loop.call_at(self.deadline, self._expire)

    async def read(self, max_bytes: int, timeout: float | None) -> bytes:
        if not self.chunks:
            if self.ended:
                if self.error is not None:
                    raise httpcore.ReadError(str(self.error) or type(self.error).__name__)
                return b""
            self.reader = self.loop.create_future()
            if timeout is not None:
                self._arm(timeout)
            try:
                await self.reader
            except TimeoutError:
                raise httpcore.ReadTimeout("timed out") from None
            finally:
                self.reader = None
            if not self.chunks:
                return await self.read(max_bytes, timeout)  # the end: b"" or its error
        data = self.chunks.popleft()
        while self.chunks and len(data) < max_bytes:
            data += self.chunks.popleft()
        if len(data) > max_bytes:
            self.chunks.appendleft(data[max_bytes:])
            data = data[:max_bytes]
        self.unread -= len(data)
        if self.paused and self.unread <= READ_HIGH_WATER // 4 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data


class AsyncioStream(AsyncNetworkStream):
    """One connection to a head (httpcore's stream interface)."""

    def __init__(self, transport: asyncio.Transport, connection: _Connection) -> None:
        self._transport = transport
        self._connection = connection

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._connection.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        connection = self._connection
        if connection.ended or self._transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        self._transport.write(buffer)
        writable = connection.writable
        if writable is not None and not writable.done():
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(writable)
            except TimeoutError:
                raise httpcore.WriteTimeout("timed out") from None
        if connection.error is not None:
            raise httpcore.WriteError(str(connection.error))

    async def aclose(self) -> None:
        timer = self._connection.timer
        if timer is not None:
            timer.cancel()
            self._connection.timer = None
        self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> AsyncNetworkStream:
        loop = self._connection.loop
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(
                    self._transport, self._connection, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError:
            self._transport.close()
            raise httpcore.ConnectTimeout("timed out") from None
        except (OSError, ssl.SSLError) as error:
            self._transport.close()
            raise httpcore.ConnectError(str(error)) from error
        assert transport is not None and isinstance(transport, asyncio.Transport)
        self._connection.transport = transport
        return AsyncioStream(transport, self._connection)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # an idle connection the peer closed (or wrote to)
            return bool(self._connection.chunks) or self._connection.ended
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info in ("ssl_object", "socket"):
            return self._transport.get_extra_info(info)
        return None


class AsyncioBackend(AsyncNetworkBackend):
    """httpcore's network backend on asyncio protocols (see the module docstring)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = None if local_address is None else (local_address, 0)
        try:
            async with asyncio.timeout(timeout):
                transport, connection = await loop.create_connection(
                    _Connection, host, port, local_addr=local
                )
        except TimeoutError:
            raise httpcore.ConnectTimeout("timed out") from None
        except OSError as error:
            raise httpcore.ConnectError(str(error)) from error
        _set_options(transport, socket_options)
        return AsyncioStream(transport, connection)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, connection = await loop.create_unix_connection(_Connection, path)
        except TimeoutError:
            raise httpcore.ConnectTimeout("timed out") from None
        except OSError as error:
            raise httpcore.ConnectError(str(error)) from error
        _set_options(transport, socket_options)
        return AsyncioStream(transport, connection)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _set_options(
    transport: asyncio.Transport, options: Iterable[httpcore.SOCKET_OPTION] | None
) -> None:
    sock: socket.socket | None = transport.get_extra_info("socket")
    if sock is None:
        return
    for option in options or ():
        sock.setsockopt(*option)
