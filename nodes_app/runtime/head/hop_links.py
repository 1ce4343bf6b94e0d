"""The head's end of its hop links: one persistent websocket per downstream endpoint.

Every generation this head runs sends its steps for a hop over that hop's one
link (``/v1/link``, frame format: ``wire.frames``), so a step costs one websocket
message each way instead of an HTTP request. Steps queued for the same link
within one event-loop tick leave as one frame (the flush is scheduled with
``loop.call_soon``, never a timer: a lone step goes at once), so the steps of
many sessions that are ready together reach the hop together.

Each step waits for its own answer, within its own deadline
(:class:`LinkTimeout`). A link that drops fails every step pending on it
(:class:`LinkDropped`) and is forgotten: the next step opens a new one. So is
a link on which nothing at all arrived while a step timed out: a half-open
connection (a hop host gone without closing it) would otherwise make every
later step wait out its deadline. A hop closes a link that was idle for its
idle timeout with ``LINK_CLOSE_IDLE``, having read nothing after deciding so:
what was in flight on it is sent again, once, on a new link.

A link opens with a hello (``HelloEntry``): the credentials of the first
entry sent on it, alone in a small frame, and nothing else is sent until the
hop has answered it (the hop reads only small frames until then). Frames stay
within what the hop parses: the frame limit, and a header under
``LINK_MAX_HEADER_BYTES`` (each entry's header bytes estimated from above:
its fields, its plan and its id lists).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.frames import Frame, Opcode
from websockets.protocol import Event, State

from nodes_app.protocol.errors import relayable_code
from nodes_app.protocol.limits import (
    LINK_CLOSE_IDLE,
    LINK_MAX_FRAME_BYTES,
    LINK_MAX_HEADER_BYTES,
    LINK_PATH,
    PREFIX_HASH_HEX,
)
from nodes_app.runtime.wire.entries import (
    CancelEntry,
    ClaimEntry,
    ForwardStep,
    FrameError,
    HelloEntry,
    LinkStep,
    StepAnswer,
)
from nodes_app.runtime.wire.frames import decode_answers, encode_requests

logger = logging.getLogger("meshnet.node")

# How long opening a link may take (TCP connect and websocket handshake).
LINK_CONNECT_SECONDS = 5.0
# Header bytes an entry takes besides its plan and id lists, at most (its fields,
# a capability, the JSON around them), and per token id (up to 7 digits and a comma).
_ENTRY_HEADER_BYTES = 1024
_ID_HEADER_BYTES = 8
# A block hash in a claim or a cancel: its hex digits, quotes and a comma.
_HASH_HEADER_BYTES = PREFIX_HASH_HEX + 3

Entry = LinkStep | CancelEntry | ClaimEntry


def _header_bytes(entry: Entry) -> int:
    """An upper bound of the bytes ``entry`` adds to a frame's header."""
    if isinstance(entry, CancelEntry):
        return _ENTRY_HEADER_BYTES + _HASH_HEADER_BYTES * len(entry.keep or ())
    if isinstance(entry, ClaimEntry):
        hashes = _HASH_HEADER_BYTES * len(entry.hashes)
        return _ENTRY_HEADER_BYTES + len(entry.plan or "") + hashes
    step = entry.step
    ids = sum(len(ids or ()) for ids in (step.prompt_ids, step.generated_ids, step.token_ids))
    return _ENTRY_HEADER_BYTES + len(entry.plan or "") + _ID_HEADER_BYTES * ids


class LinkError(Exception):
    """A step that got no answer on its link."""


class LinkDropped(LinkError):
    """The link could not be opened, or closed while the step waited.

    ``unread``: the hop closed it as idle, so it read nothing this step sent.
    """

    def __init__(self, message: str, *, unread: bool = False) -> None:
        super().__init__(message)
        self.unread = unread


class LinkRefused(Exception):
    """The hop refused the link's hello (its status and code)."""


class HelloUnanswered(Exception):
    """The hop accepted the connection and did not answer its hello in time."""


class LinkTimeout(LinkError):
    """No answer within the step's deadline (the link stays open)."""


def link_url(endpoint: str) -> str:
    """The websocket URL of ``endpoint``'s link (http → ws, https → wss)."""
    scheme, sep, rest = endpoint.partition("://")
    ws = {"http": "ws", "https": "wss"}.get(scheme.lower(), scheme)
    return f"{ws}{sep}{rest}{LINK_PATH}"


class _LinkConnection(ClientConnection):
    """A link's websocket whose whole binary messages go straight to ``on_frame`` as they
    are parsed (set once the hello is answered): no message queue, no reading task woken
    per answer frame. Anything else (a text message, a fragmented one) is received as by
    any connection."""

    on_frame: Callable[[bytes], None] | None = None

    def process_event(self, event: Event) -> None:
        on_frame = self.on_frame
        if (
            on_frame is not None
            and isinstance(event, Frame)
            and event.opcode is Opcode.BINARY
            and event.fin
        ):
            on_frame(bytes(event.data))
            return
        super().process_event(event)


class HopLink:
    """One open websocket to one hop; many sessions' steps share it."""

    def __init__(self, endpoint: str, *, max_frame_bytes: int) -> None:
        self.endpoint = endpoint
        self.max_frame_bytes = max_frame_bytes
        self.closed = False
        self._connection: ClientConnection | None = None
        self._opening: asyncio.Task[ClientConnection] | None = None
        self._pending: dict[int, asyncio.Future[StepAnswer]] = {}
        self._queued: list[Entry] = []
        self._flush_scheduled = False
        # Frames handed to a send task and not yet written (a later one must wait its turn).
        self._sending = 0
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        # Answer frames received so far: a step that times out while none came
        # since it was sent finds the link dead, not the step slow.
        self._received = 0

    async def step(
        self,
        step: ForwardStep,
        body: bytes,
        *,
        capability: str | None,
        plan: str | None,
        timeout: float,
    ) -> StepAnswer:
        """The hop's answer to ``step``: LinkTimeout past ``timeout`` s, LinkDropped on a drop."""
        return await self._ask(
            lambda step_id: LinkStep(step_id, step, body, capability, plan), timeout
        )

    async def cancel(
        self,
        session_id: str,
        *,
        capability: str | None,
        timeout: float,
        keep: tuple[str, ...] | None = None,
    ) -> StepAnswer:
        """Free ``session_id`` on the hop: its answer (status 204, or a refusal).

        ``keep``: the chain its state may be kept under in the hop's prefix cache.
        """
        return await self._ask(
            lambda step_id: CancelEntry(step_id, session_id, capability, keep), timeout
        )

    async def claim(
        self,
        session_id: str,
        *,
        start: int,
        end: int,
        reserve: int,
        hashes: tuple[str, ...],
        capability: str | None,
        plan: str | None,
        timeout: float,
    ) -> StepAnswer:
        """Open ``session_id`` on the hop with a prefix claim: its answer (blocks held)."""
        return await self._ask(
            lambda step_id: ClaimEntry(
                step_id, session_id, start, end, reserve, hashes, capability, plan
            ),
            timeout,
        )

    async def _ask(self, entry_for: Callable[[int], Entry], timeout: float) -> StepAnswer:
        try:
            return await self._ask_once(entry_for, timeout)
        except LinkDropped as error:
            if not error.unread:
                raise
        # The hop closed the link as idle as this was sent: it never read it.
        return await self._ask_once(entry_for, timeout)

    async def _ask_once(self, entry_for: Callable[[int], Entry], timeout: float) -> StepAnswer:
        step_id = next(self._ids)
        entry = entry_for(step_id)
        if isinstance(entry, LinkStep) and len(entry.body) + 4096 > self.max_frame_bytes:
            raise LinkDropped(f"a step of {len(entry.body)} bytes is over the link's frame limit")
        await self._open(entry, timeout)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[StepAnswer] = loop.create_future()
        self._pending[step_id] = answer
        self._queued.append(entry)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        received = self._received
        # One timer handle, not asyncio.wait_for's task and waiter: this is every step's path.
        deadline = loop.call_later(timeout, _expire, answer)
        try:
            return await answer
        except _Expired:
            if self._received == received:
                # Nothing at all came back meanwhile (a half-open connection, a
                # hop that died without closing it): later steps get a new link.
                self._drop(f"nothing received within {timeout:g} s")
            raise LinkTimeout(f"no answer within {timeout:g} s") from None
        finally:
            deadline.cancel()
            self._pending.pop(step_id, None)

    async def _open(self, first: Entry, timeout: float) -> None:
        """Open the link if it is not open, greeting the hop with ``first``'s credentials.

        A hop that accepts the connection but does not answer the hello within
        ``timeout`` (the step's deadline, at most LINK_CONNECT_SECONDS) is a hung hop:
        LinkTimeout, as for a step.
        """
        if self.closed:
            raise LinkDropped("the link is closed")
        if self._connection is not None:
            return
        if self._opening is None:
            hello = HelloEntry.of(first)
            wait = min(LINK_CONNECT_SECONDS, timeout)
            self._opening = asyncio.create_task(self._connect(hello, wait))
        try:
            await asyncio.shield(self._opening)
        except InvalidStatus as error:
            self.closed = True
            status = error.response.status_code
            raise LinkDropped(f"could not open the link (HTTP {status})") from error
        except (OSError, TimeoutError, WebSocketException, FrameError) as error:
            self.closed = True
            raise LinkDropped(f"could not open the link ({type(error).__name__})") from error
        except LinkRefused as error:
            self.closed = True
            raise LinkDropped(str(error)) from error
        except HelloUnanswered as error:
            self.closed = True
            raise LinkTimeout(str(error)) from error

    async def _connect(self, hello: HelloEntry, wait: float) -> ClientConnection:
        connection = await connect(
            link_url(self.endpoint),
            open_timeout=LINK_CONNECT_SECONDS,
            max_size=self.max_frame_bytes,
            compression=None,
            # A hung hop is found by each step's deadline, not by pings.
            ping_interval=None,
            close_timeout=1.0,
            create_connection=_LinkConnection,
        )
        try:
            await connection.send(encode_requests([hello]))
            try:
                reply = await asyncio.wait_for(connection.recv(), wait)
            except TimeoutError:
                raise HelloUnanswered(f"no answer to the link's hello within {wait:g} s") from None
            answers = decode_answers(reply) if isinstance(reply, bytes) else []
            if [answer.status for answer in answers] != [204]:
                code = relayable_code(answers[0].code) if answers else None
                raise LinkRefused(f"the hop refused the link ({code or 'no answer'})")
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.close()
            raise
        self._connection = connection
        if isinstance(connection, _LinkConnection):
            connection.on_frame = lambda frame: self._answer(connection, frame)
        self._spawn(self._read(connection))
        return connection

    def _answer(self, connection: _LinkConnection, frame: bytes) -> None:
        """Hand each answer of ``frame`` to the step waiting for it; a malformed frame
        closes the link (and fails what is pending on it)."""
        self._received += 1
        try:
            answers = decode_answers(frame)
        except FrameError as error:
            connection.on_frame = _ignore
            reason = f"the hop sent a malformed frame: {error}"
            logger.warning("link to %s: %s", self.endpoint, reason)
            self._drop(reason, connection)
            self._spawn(_close(connection))
            return
        for answer in answers:
            waiting = self._pending.get(answer.step_id)
            if waiting is not None and not waiting.done():
                waiting.set_result(answer)

    def _flush(self) -> None:
        """Send what was queued this tick, in as few frames as the hop's limits allow."""
        self._flush_scheduled = False
        queued, self._queued = self._queued, []
        frame: list[Entry] = []
        size = header = 0
        for entry in queued:
            length = len(entry.body) if isinstance(entry, LinkStep) else 0
            entry_header = _header_bytes(entry)
            if frame and (
                size + length + 4096 > self.max_frame_bytes
                or header + entry_header > LINK_MAX_HEADER_BYTES
            ):
                self._write(encode_requests(frame))
                frame, size, header = [], 0, 0
            frame.append(entry)
            size += length + 512
            header += entry_header
        if frame:
            self._write(encode_requests(frame))

    def _write(self, frame: bytes) -> None:
        """Send ``frame``: at once when the socket takes it and no send waits before it
        (no task, no send context: this is every step's path), else by a task, in order."""
        connection = self._connection
        if connection is None:
            self._drop("the link is closed")
            return
        if self._sending == 0 and _writable_now(connection):
            try:
                connection.protocol.send_binary(frame)
                connection.send_data()
            except OSError as error:
                self._drop(f"sending failed: {type(error).__name__}", connection)
            return
        self._sending += 1
        self._spawn(self._send(connection, frame))

    async def _send(self, connection: ClientConnection, frame: bytes) -> None:
        try:
            await connection.send(frame)
        except (ConnectionClosed, OSError) as error:
            self._drop(f"sending failed: {type(error).__name__}", connection)
        finally:
            self._sending -= 1

    async def _read(self, connection: ClientConnection) -> None:
        reason = "the hop closed the link"
        try:
            async for message in connection:
                if isinstance(message, str):
                    raise FrameError("a text message, not a frame")
                self._received += 1
                for answer in decode_answers(message):
                    waiting = self._pending.get(answer.step_id)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(answer)
        except ConnectionClosed as error:
            reason = f"the link closed ({error.rcvd.code if error.rcvd else 'no close frame'})"
        except FrameError as error:
            reason = f"the hop sent a malformed frame: {error}"
            logger.warning("link to %s: %s", self.endpoint, reason)
        finally:
            self._drop(reason, connection)
            with contextlib.suppress(Exception):
                await connection.close()

    def _drop(self, reason: str, connection: ClientConnection | None = None) -> None:
        """Forget this link and fail every step pending on it.

        A link ``connection`` the hop closed as idle is not forgotten: the steps
        pending on it fail as unread (sent again on a new connection).
        """
        if connection is not None and connection is not self._connection:
            return  # an older connection of this link, already replaced
        unread = connection is not None and connection.close_code == LINK_CLOSE_IDLE
        if unread:
            logger.info("link to %s closed by the hop as idle", self.endpoint)
            self._connection = None
            self._opening = None
        else:
            if not self.closed:
                logger.info("link to %s dropped: %s", self.endpoint, reason)
            self.closed = True
        pending, self._pending = self._pending, {}
        for waiting in pending.values():
            if not waiting.done():
                waiting.set_exception(LinkDropped(reason, unread=unread))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        self._drop("the head is closing")
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()


def _ignore(frame: bytes) -> None:
    """What a link does with frames after a malformed one: nothing (it is closing)."""


async def _close(connection: ClientConnection) -> None:
    with contextlib.suppress(Exception):
        await connection.close()


class _Expired(Exception):
    """A step's deadline passed before its answer came."""


def _expire(answer: asyncio.Future[StepAnswer]) -> None:
    if not answer.done():
        answer.set_exception(_Expired())


def _writable_now(connection: ClientConnection) -> bool:
    """Whether a frame written to ``connection`` now goes out without waiting: open, not
    paused for a hop that reads slowly, no fragmented message being sent."""
    return (
        connection.protocol.state is State.OPEN
        and not connection.paused
        and connection.fragmented_send_waiter is None
        and not connection.transport.is_closing()
    )


class HopLinks:
    """The head's links, one per downstream endpoint, opened on first use and after a drop."""

    def __init__(self, *, max_frame_bytes: int = LINK_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._links: dict[str, HopLink] = {}

    def to(self, endpoint: str) -> HopLink:
        link = self._links.get(endpoint)
        if link is None or link.closed:
            link = self._links[endpoint] = HopLink(endpoint, max_frame_bytes=self.max_frame_bytes)
        return link

    async def aclose(self) -> None:
        links, self._links = list(self._links.values()), {}
        for link in links:
            await link.aclose()
