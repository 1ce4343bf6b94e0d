"""A hop link's incoming frames, read below the ASGI receive while a bounded buffer allows.

uvicorn's websocket protocol queues each message it parses for the app and
pauses reading the socket until the app has taken it, then resumes: two
``epoll_ctl`` calls and a task wake-up per message, on every token's path.
:class:`Inbox` stands in for that queue (``link_guard.Connection.inbox``):
the socket keeps reading while the frames waiting unread hold at most
``read_ahead`` bytes, and pauses the moment they hold more (a frame over
it pauses at once, as uvicorn would). A link that has not shown a valid
plan or capability reads with ``read_ahead`` 0: one frame at a time, paused
while it waits, exactly as under uvicorn's own queue. The frame size limit
(``Connection.limit_messages``) is the parser's and unchanged.

Elsewhere (another server, an in-process test client) :meth:`Inbox.pumping`
feeds one from the ASGI ``receive``, one message ahead at most.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]


class Inbox:
    """Messages received and not yet taken; wakes its one reader on each, or on :meth:`wake`."""

    def __init__(self, transport: asyncio.Transport | None = None, protocol: Any = None) -> None:
        self._transport = transport
        # The uvicorn protocol whose queue this replaces: kept from pausing on its own.
        self._protocol = protocol
        self._messages: deque[Message] = deque()
        self._bytes = 0
        self.read_ahead = 0
        self._waiter: asyncio.Future[None] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._room: asyncio.Future[None] | None = None

    @classmethod
    def pumping(cls, receive: Callable[[], Awaitable[Message]]) -> Inbox:
        """An inbox fed by ``receive`` (an ASGI receive), one message ahead at most."""
        inbox = cls()
        inbox._pump = asyncio.get_running_loop().create_task(inbox._feed(receive))
        return inbox

    async def _feed(self, receive: Callable[[], Awaitable[Message]]) -> None:
        while True:
            try:
                message = await receive()
            except Exception:
                # The ASGI side broke off: the link ends as on an abnormal close.
                self.put_nowait({"type": "websocket.disconnect", "code": 1006})
                return
            self.put_nowait(message)
            if message.get("type") == "websocket.disconnect":
                return
            while self._messages:
                self._room = asyncio.get_running_loop().create_future()
                await self._room

    # --- what uvicorn calls on its queue -----------------------------------------------

    def put_nowait(self, message: Message) -> None:
        self._messages.append(message)
        self._bytes += len(message.get("bytes") or message.get("text") or b"")
        if self._protocol is not None:
            self._protocol.read_paused = True  # so that uvicorn leaves pausing to this
        if self._bytes > self.read_ahead and self._transport is not None:
            self._transport.pause_reading()
        self.wake()

    def empty(self) -> bool:
        return not self._messages

    def qsize(self) -> int:
        return len(self._messages)

    async def get(self) -> Message:
        while True:
            message = self.take()
            if message is not None:
                return message
            await self.wait(None)

    # --- the link server's side ----------------------------------------------------------

    def take(self) -> Message | None:
        """The oldest message not yet taken, or None; reading resumes once under the bound."""
        if not self._messages:
            return None
        message = self._messages.popleft()
        self._bytes -= len(message.get("bytes") or message.get("text") or b"")
        transport = self._transport
        if (
            transport is not None
            and self._bytes <= self.read_ahead
            and not transport.is_reading()
            and not transport.is_closing()
        ):
            transport.resume_reading()
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)
        return message

    async def wait(self, timeout: float | None) -> None:
        """Until a message is there, :meth:`wake` is called or ``timeout`` s pass."""
        if self._messages:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _resolve, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiter = None

    def wake(self) -> None:
        """Wake the reader waiting in :meth:`wait` (a message came, or something to check)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        """Stop feeding a pumping inbox."""
        if self._pump is not None:
            self._pump.cancel()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
