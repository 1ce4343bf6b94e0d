"""The hop's end of a link: steps in by the frame, run together, answers out by the tick.

One websocket per head→hop pair carries every session that head runs through
this node (frame format: ``wire.frames``). For each frame the hop checks every step
on its fields and credentials before any tensor work (``engine.trust``: a session
opens only with a signed plan naming this node with exactly those layers;
later steps and cancels need the session's capability; a step's bytes must
equal its shape × dtype), then submits all admitted steps to
``NodeService.forward`` at once — tasks created in one go, so the node runs
them as one batch when it can. Answers that are ready in the same event-loop
tick leave as one frame. A step refused or failed fails alone; a frame that
is not one (or is over the size limit) closes the link with a log line, and
the head fails what was pending on it.

Who may keep a link open, and for how long, is ``link_guard``'s policy: the
cheap checks (links per peer, the frame's and its header's size) come before
the header is parsed, and a link that has not yet shown a valid plan or
capability gets one frame, decoded in the strangers' turn. Frames are taken
from the connection's own receive queue (``link_inbox``): a link that has
shown one reads ahead within a bound, a stranger's one frame at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from starlette.websockets import WebSocket, WebSocketDisconnect

from nodes_app.protocol.limits import (
    CAPABILITY,
    LINK_CLOSE_IDLE,
    LINK_FIRST_FRAME_BYTES,
    PLAN,
    link_header_limit,
)
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.trust import Grant
from nodes_app.runtime.faults import NonFiniteOutput, RuntimeRequestError
from nodes_app.runtime.hop import prefix_claim, step_intake
from nodes_app.runtime.hop.link_answers import Answers
from nodes_app.runtime.hop.link_guard import Connection, PeerLinks, check_plan_shown
from nodes_app.runtime.hop.link_inbox import Inbox
from nodes_app.runtime.wire.entries import (
    CancelEntry,
    Choice,
    ClaimEntry,
    FrameError,
    HelloEntry,
    LinkStep,
    RefusedEntry,
    StepAnswer,
)
from nodes_app.runtime.wire.frames import decode_requests

logger = logging.getLogger("meshnet.node")

# websocket close codes (RFC 6455): the frame is not one of ours / it is too large /
# the peer breaks the protocol's flow (answers left unread, steps piled up).
CLOSE_MALFORMED = 1007
CLOSE_POLICY = 1008
CLOSE_TOO_LARGE = 1009
# Steps of one link running at once, at most: a head has one in flight per session.
MAX_RUNNING_STEPS = 4096


def _credentials(capability: str | None, plan: str | None = None) -> Mapping[str, str]:
    """An entry's credentials in the form ``engine.trust`` reads them."""
    held = {CAPABILITY: capability, PLAN: plan}
    return {name: value for name, value in held.items() if value is not None}


async def serve_link(
    websocket: WebSocket, service: NodeService, *, max_frame_bytes: int, peers: PeerLinks
) -> None:
    """Serve one head's link until it closes, or until ``peers``' policy closes it."""
    host = websocket.client.host if websocket.client else "?"
    peer = f"{host}:{websocket.client.port}" if websocket.client else "?"
    refused = peers.enter(host)
    if refused is not None:
        logger.warning("link from %s refused: %s", peer, refused)
        await websocket.close(code=CLOSE_POLICY)  # before the handshake: HTTP 403
        return
    try:
        # Made here, in the connection's own task (see Connection).
        connection = Connection()
        await websocket.accept()
        link = _Link(
            websocket,
            service,
            peers,
            host=host,
            peer=peer,
            max_frame_bytes=max_frame_bytes,
            connection=connection,
        )
        await link.serve(connection)
    finally:
        peers.leave(host)


class _Link:
    """One link's state: whether it showed a valid plan or capability, and what it owes."""

    def __init__(
        self,
        websocket: WebSocket,
        service: NodeService,
        peers: PeerLinks,
        *,
        host: str,
        peer: str,
        max_frame_bytes: int,
        connection: Connection | None = None,
    ) -> None:
        self.websocket = websocket
        self.host = host
        self.service = service
        self.peers = peers
        self.policy = peers.policy
        self.peer = peer
        self.max_frame_bytes = max_frame_bytes
        # A dev-open node serves anyone: every link is trusted from the start.
        self.trusted = service.gate.dev_open
        self.admitted = 0
        self.refused = 0
        self.running: set[asyncio.Task[None]] = set()
        self.answers = Answers(websocket, self.policy, connection)
        self.inbox = Inbox()
        self.opened_at = self.active_at = time.monotonic()

    @property
    def frame_limit(self) -> int:
        """The largest frame read now: a small one until the link has shown credentials."""
        return self.max_frame_bytes if self.trusted else LINK_FIRST_FRAME_BYTES

    async def serve(self, connection: Connection) -> None:
        connection.limit_messages(self.frame_limit)
        # Frames straight from the connection's own queue, else pumped from the ASGI receive.
        inbox = connection.inbox() or Inbox.pumping(self.websocket.receive)
        self.inbox = inbox
        if self.trusted:
            inbox.read_ahead = self.policy.read_ahead_bytes
        self.answers.wake = inbox.wake
        writer = asyncio.create_task(self.answers.send_all())
        try:
            while True:
                message = inbox.take()
                if message is None:
                    await inbox.wait(self._next_deadline())
                    message = inbox.take()
                if self.answers.stuck.is_set() or self.answers.write_stalled():
                    logger.warning(
                        "link from %s cut off: the peer does not read its answers (%d bytes "
                        "unsent)",
                        self.peer,
                        self.answers.unsent,
                    )
                    connection.abort()
                    return
                if message is None:
                    if not self.trusted and self._hello_due():
                        why = f"no valid plan or capability within {self.policy.hello_seconds:g} s"
                        await self._close(CLOSE_POLICY, why, connection)
                        return
                    if self.trusted and self._idle():
                        why = f"idle: no valid step for {self.policy.idle_seconds:g} s"
                        await self._close(LINK_CLOSE_IDLE, why, connection, level=logging.INFO)
                        return
                    continue
                if message["type"] == "websocket.disconnect":
                    if message.get("code") == CLOSE_TOO_LARGE:
                        if not self.trusted:
                            self.peers.strike(self.host)
                        logger.warning(
                            "link from %s closed: a frame over %d bytes",
                            self.peer,
                            self.frame_limit,
                        )
                    return
                if not await self._frame(message.get("bytes"), connection) or writer.done():
                    return
        finally:
            writer.cancel()
            inbox.close()

    def _hello_due(self) -> bool:
        return time.monotonic() >= self.opened_at + self.policy.hello_seconds

    def _next_deadline(self) -> float:
        """Seconds until the hello, idle or write deadline next needs a look."""
        now = time.monotonic()
        if not self.trusted:
            due = self.opened_at + self.policy.hello_seconds
        else:
            due = self._active_at() + self.policy.idle_seconds
        if self.answers.waiting:
            due = min(due, self.answers.progress_at + self.policy.write_seconds)
        return max(0.01, due - now + 0.001)

    def _active_at(self) -> float:
        return max(self.active_at, self.answers.progress_at)

    def _idle(self) -> bool:
        if self.running or not self.answers.idle:
            return False
        return time.monotonic() - self._active_at() >= self.policy.idle_seconds

    async def _frame(self, frame: bytes | None, connection: Connection) -> bool:
        """Check, decode and admit one frame; False once the link is closed."""
        if frame is None:
            await self._close(CLOSE_MALFORMED, "a text message, not a frame", connection)
            return False
        if len(frame) > self.frame_limit:
            await self._close(CLOSE_TOO_LARGE, f"a frame over {self.frame_limit} bytes", connection)
            return False
        limit = link_header_limit(len(frame), trusted=self.trusted)
        try:
            if self.trusted:
                entries = decode_requests(frame, max_header=limit)
            else:
                async with self.peers.stranger_turn():
                    entries = decode_requests(frame, max_header=limit)
        except FrameError as error:
            await self._close(CLOSE_MALFORMED, str(error), connection)
            return False
        for entry in entries:
            task, valid = _admit(self.service, entry, self.answers)
            if task is not None:
                self.running.add(task)
                task.add_done_callback(self.running.discard)
            if valid:
                if not self.trusted:
                    self.trusted = True
                    # Before its answer leaves: the head sends big frames only after it.
                    connection.limit_messages(self.max_frame_bytes)
                    self.inbox.read_ahead = self.policy.read_ahead_bytes
                self.admitted += 1
                self.active_at = time.monotonic()
                continue
            self.refused += 1
            if not self.trusted and self.refused > self.policy.stranger_refusals:
                why = f"{self.refused} entries refused and no valid plan or capability"
                await self._close(CLOSE_POLICY, why, connection, drain=True)
                return False
            if self.refused > self.policy.refusals_allowed(self.admitted):
                why = f"{self.refused} entries refused against {self.admitted} admitted"
                await self._close(CLOSE_POLICY, why, connection, drain=True)
                return False
        if len(self.running) > MAX_RUNNING_STEPS:
            # An honest head waits for each step's answer before its session's next.
            await self._close(CLOSE_POLICY, "the peer does not wait for its answers", connection)
            return False
        return True

    async def _close(
        self,
        code: int,
        why: str,
        connection: Connection,
        *,
        drain: bool = False,
        level: int = logging.WARNING,
    ) -> None:
        """Close with ``code``, after the refusals answered so far when ``drain``.

        A link that never showed a valid plan or capability is a strike against its address.
        """
        logger.log(level, "link from %s closed: %s (what was on it fails)", self.peer, why)
        if not self.trusted:
            self.peers.strike(self.host)
        if drain:
            await self.answers.drain(timeout=1.0)
        try:
            # A peer that reads nothing never lets the close frame out: cut it off.
            await asyncio.wait_for(self.websocket.close(code=code, reason=why[:100]), 2.0)
        except (TimeoutError, OSError, RuntimeError, WebSocketDisconnect):
            connection.abort()


def _admit(
    service: NodeService,
    entry: LinkStep | CancelEntry | HelloEntry | ClaimEntry | RefusedEntry,
    answers: Answers,
) -> tuple[asyncio.Task[None] | None, bool]:
    """Check ``entry`` before any tensor work: the task running it (None once answered),
    and whether it showed a valid plan or capability (passed its checks and ``engine.trust``)."""
    if isinstance(entry, RefusedEntry):
        answers.put(StepAnswer.refusal(entry.step_id, entry.error))
        return None, False
    if isinstance(entry, CancelEntry):
        return None, _cancel(service, entry, answers)
    if isinstance(entry, HelloEntry):
        return None, _hello(service, entry, answers)
    if isinstance(entry, ClaimEntry):
        try:
            grant = prefix_claim.admit(service, entry, _credentials(entry.capability, entry.plan))
        except RuntimeRequestError as error:
            answers.put(StepAnswer.refusal(entry.step_id, error))
            return None, False
        return asyncio.create_task(_claim(service, entry, grant, answers)), True
    step = entry.step
    try:
        capability = step_intake.admit(service, step, _credentials(entry.capability, entry.plan))
    except RuntimeRequestError as error:
        answers.put(StepAnswer.refusal(entry.step_id, error))
        return None, False
    try:
        step_intake.check_length(step, entry.body)
    except RuntimeRequestError as wrong:
        answers.put(StepAnswer.refusal(entry.step_id, wrong))
        return None, True
    return asyncio.create_task(_forward(service, entry, capability, answers)), True


async def _forward(
    service: NodeService, entry: LinkStep, capability: Grant, answers: Answers
) -> None:
    step = entry.step
    try:
        result = await step_intake.forward(service, step, entry.body, capability)
    except RuntimeRequestError as error:
        answer = StepAnswer.refusal(entry.step_id, error)
    except NonFiniteOutput as error:
        # This node's own computation went wrong: its fault, a 5xx.
        service.cancel(step.session_id)
        answer = StepAnswer.refusal(
            entry.step_id,
            _own_fault(f"this node computed NaN or infinite values: {error}", "non_finite_output"),
        )
    except Exception:
        logger.exception("step failed")
        service.cancel(step.session_id)
        answer = StepAnswer.refusal(
            entry.step_id, _own_fault("the step failed on this node", "step_failed")
        )
    else:
        if isinstance(result, Choice):
            answer = StepAnswer.chosen(entry.step_id, result)
        else:
            answer = StepAnswer(
                entry.step_id, hidden=result, dtype=service.dtype_name, shape=step.shape
            )
    if answer.status != 200:
        logger.info(
            "step of %s refused: %d %s: %s",
            step.session_id,
            answer.status,
            answer.code,
            answer.message,
        )
    answers.put(answer)


async def _claim(service: NodeService, entry: ClaimEntry, grant: Grant, answers: Answers) -> None:
    try:
        answer = await prefix_claim.answer(service, entry, grant)
    except RuntimeRequestError as error:
        answer = StepAnswer.refusal(entry.step_id, error)
    except Exception:
        logger.exception("claim failed")
        answer = StepAnswer.refusal(
            entry.step_id, _own_fault("the claim failed on this node", "step_failed")
        )
    answers.put(answer)


def _hello(service: NodeService, entry: HelloEntry, answers: Answers) -> bool:
    """Answer a link's hello: 204 when it shows its session's capability (a session this
    node holds) or a plan naming this node for it (``check_plan_shown``), else a refusal."""
    credentials = _credentials(entry.capability, entry.plan)
    try:
        session = service.store.get(entry.session_id)
        if session is not None:
            service.gate.check_capability(credentials, session.capability)
        elif not service.gate.dev_open:
            check_plan_shown(
                service.gate,
                credentials,
                node_id=service.node_id,
                session_id=entry.session_id,
            )
    except RuntimeRequestError as error:
        answers.put(StepAnswer.refusal(entry.step_id, error))
        return False
    answers.put(StepAnswer(entry.step_id, status=204))
    return True


def _cancel(service: NodeService, entry: CancelEntry, answers: Answers) -> bool:
    """Free the session ``entry`` names; whether it presented that session's capability."""
    try:
        credentials = _credentials(entry.capability)
        if not service.end_session(entry.session_id, credentials, keep=entry.keep):
            raise RuntimeRequestError("no such session", code="unknown_session", status=404)
    except RuntimeRequestError as error:
        answers.put(StepAnswer.refusal(entry.step_id, error))
        return False
    answers.put(StepAnswer(entry.step_id, status=204))
    return True


def _own_fault(message: str, code: str) -> RuntimeRequestError:
    return RuntimeRequestError(message, code=code, status=500, error_type="server_error")
