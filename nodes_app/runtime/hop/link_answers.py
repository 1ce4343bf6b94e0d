"""A hop link's answers on their way out: batched by the tick, watched for a peer that
does not read them (``link_guard``'s send buffer and write timeout)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from nodes_app.runtime.hop.link_guard import Connection, LinkPolicy
from nodes_app.runtime.wire.entries import StepAnswer
from nodes_app.runtime.wire.frames import encode_answers


class Answers:
    """Answers ready in one event-loop tick go out as one frame, frames in order.

    It also watches whether the peer reads them: ``stuck`` is set once more
    than the send buffer waits behind the frame being written, and
    :meth:`write_stalled` tells when no frame could be written for the write timeout.
    A frame with none queued before it is written at once (``Connection.send_now``)
    when the socket takes it; the rest queue for :meth:`send_all`.
    """

    def __init__(
        self, websocket: WebSocket, policy: LinkPolicy, connection: Connection | None = None
    ) -> None:
        self.websocket = websocket
        self.policy = policy
        self.connection = connection
        self.ready: list[StepAnswer] = []
        self.frames: asyncio.Queue[bytes] = asyncio.Queue()
        self.flush_scheduled = False
        # Frames and bytes queued or being written, and the bytes of the one being written.
        self.waiting = 0
        self.unsent = 0
        self.writing = 0
        # When a frame was last written (or the queue last became non-empty).
        self.progress_at = time.monotonic()
        self.stuck = asyncio.Event()
        # Called once stuck is set: the link's reader looks at it.
        self.wake: Callable[[], None] | None = None

    def put(self, answer: StepAnswer) -> None:
        self.ready.append(answer)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        ready, self.ready = self.ready, []
        frame = encode_answers(ready)
        if self.waiting == 0:
            self.progress_at = time.monotonic()
            if self.connection is not None and self.connection.send_now(frame):
                return
        self.waiting += 1
        self.unsent += len(frame)
        self.frames.put_nowait(frame)
        if self.unsent - self.writing > self.policy.send_buffer_bytes and self.waiting > 1:
            self.stuck.set()
            if self.wake is not None:
                self.wake()

    def write_stalled(self) -> bool:
        return self.waiting > 0 and time.monotonic() - self.progress_at > self.policy.write_seconds

    @property
    def idle(self) -> bool:
        return self.waiting == 0 and not self.ready

    async def send_all(self) -> None:
        """Send frames until the link closes (answers still running are then dropped)."""
        try:
            while True:
                frame = await self.frames.get()
                self.writing = len(frame)
                await self.websocket.send_bytes(frame)
                self.writing = 0
                self.waiting -= 1
                self.unsent -= len(frame)
                self.progress_at = time.monotonic()
        except (OSError, RuntimeError, WebSocketDisconnect):
            return

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every answer put so far is written."""
        deadline = time.monotonic() + timeout
        await asyncio.sleep(0)  # the flush scheduled by the last put
        while not self.idle and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
