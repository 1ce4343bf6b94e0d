"""The hop's end of a link: steps in by the frame, run together, answers out by the tick.

One websocket per head→hop pair carries every session that head runs through
this node (frame format: ``wire``). For each frame the hop checks every step
on its fields and credentials before any tensor work (``trust``: a session
opens only with a signed plan naming this node with exactly those layers;
later steps and cancels need the session's capability; a step's bytes must
equal its shape × dtype), then submits all admitted steps to
``NodeService.forward`` at once — tasks created in one go, so the node runs
them as one batch when it can. Answers that are ready in the same event-loop
tick leave as one frame. A step refused or failed fails alone; a frame that
is not one (or is over the size limit) closes the link with a log line, and
the head fails what was pending on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from starlette.websockets import WebSocket, WebSocketDisconnect

from nodes_app.protocol.limits import CAPABILITY, PLAN
from nodes_app.runtime import wire
from nodes_app.runtime.errors import NonFiniteOutput, RuntimeRequestError
from nodes_app.runtime.sampling import Choice
from nodes_app.runtime.service import NodeService
from nodes_app.runtime.trust import Grant

logger = logging.getLogger("meshnet.node")

# websocket close codes (RFC 6455): the frame is not one of ours / it is too large /
# the peer breaks the protocol's flow (answers left unread, steps piled up).
CLOSE_MALFORMED = 1007
CLOSE_POLICY = 1008
CLOSE_TOO_LARGE = 1009
# Steps of one link running at once, at most: a head has one in flight per session.
MAX_RUNNING_STEPS = 4096


def _credentials(capability: str | None, plan: str | None = None) -> Mapping[str, str]:
    """An entry's credentials in the form ``trust`` reads them."""
    held = {CAPABILITY: capability, PLAN: plan}
    return {name: value for name, value in held.items() if value is not None}


class _Answers:
    """Answers ready in one event-loop tick go out as one frame, frames in order."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.ready: list[wire.StepAnswer] = []
        self.frames: asyncio.Queue[bytes] = asyncio.Queue()
        self.flush_scheduled = False
        # Bytes of answer frames not yet sent: what a peer that stops reading holds here.
        self.unsent = 0

    def put(self, answer: wire.StepAnswer) -> None:
        self.ready.append(answer)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        ready, self.ready = self.ready, []
        frame = wire.encode_answers(ready)
        self.unsent += len(frame)
        self.frames.put_nowait(frame)

    async def send_all(self) -> None:
        """Send frames until the link closes (answers still running are then dropped)."""
        try:
            while True:
                frame = await self.frames.get()
                await self.websocket.send_bytes(frame)
                self.unsent -= len(frame)
        except (OSError, RuntimeError, WebSocketDisconnect):
            return


async def serve_link(websocket: WebSocket, service: NodeService, *, max_frame_bytes: int) -> None:
    """Serve one head's link until it closes."""
    await websocket.accept()
    peer = f"{websocket.client.host}:{websocket.client.port}" if websocket.client else "?"
    answers = _Answers(websocket)
    writer = asyncio.create_task(answers.send_all())
    running: set[asyncio.Task[None]] = set()
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                if message.get("code") == CLOSE_TOO_LARGE:
                    logger.warning(
                        "link from %s closed: a frame over %d bytes", peer, max_frame_bytes
                    )
                return
            frame = message.get("bytes")
            if frame is None:
                await _close(websocket, peer, CLOSE_MALFORMED, "a text message, not a frame")
                return
            if len(frame) > max_frame_bytes:
                await _close(
                    websocket, peer, CLOSE_TOO_LARGE, f"a frame over {max_frame_bytes} bytes"
                )
                return
            try:
                entries = wire.decode_requests(frame)
            except wire.FrameError as error:
                await _close(websocket, peer, CLOSE_MALFORMED, str(error))
                return
            for entry in entries:
                task = _admit(service, entry, answers)
                if task is not None:
                    running.add(task)
                    task.add_done_callback(running.discard)
            if writer.done():
                return
            if answers.unsent > max_frame_bytes or len(running) > MAX_RUNNING_STEPS:
                # An honest head reads its answers as they come and waits for
                # each step's answer before the next: this peer does neither.
                await _close(websocket, peer, CLOSE_POLICY, "the peer does not read its answers")
                return
    finally:
        writer.cancel()


async def _close(websocket: WebSocket, peer: str, code: int, why: str) -> None:
    logger.warning("link from %s closed: %s (what was on it fails)", peer, why)
    await websocket.close(code=code, reason=why[:100])


def _admit(
    service: NodeService,
    entry: wire.LinkStep | wire.CancelEntry | wire.RefusedEntry,
    answers: _Answers,
) -> asyncio.Task[None] | None:
    """Check ``entry`` before any tensor work; the task running it, or None once answered."""
    if isinstance(entry, wire.RefusedEntry):
        answers.put(wire.StepAnswer.refusal(entry.step_id, entry.error))
        return None
    if isinstance(entry, wire.CancelEntry):
        return asyncio.create_task(_cancel(service, entry, answers))
    step = entry.step
    try:
        service.admission.check_step(step)
        capability = service.admission.admit_step(step, _credentials(entry.capability, entry.plan))
        expected = wire.body_length(step)
        if len(entry.body) != expected:
            raise RuntimeRequestError(
                f"the step has {len(entry.body)} bytes; its shape and dtype need {expected}",
                code="bad_length",
            )
    except RuntimeRequestError as error:
        answers.put(wire.StepAnswer.refusal(entry.step_id, error))
        return None
    return asyncio.create_task(_forward(service, entry, capability, answers))


async def _forward(
    service: NodeService, entry: wire.LinkStep, capability: Grant, answers: _Answers
) -> None:
    step = entry.step
    try:
        result = await service.forward(step, entry.body, capability)
    except RuntimeRequestError as error:
        answer = wire.StepAnswer.refusal(entry.step_id, error)
    except NonFiniteOutput as error:
        # This node's own computation went wrong: its fault, a 5xx.
        service.cancel(step.session_id)
        answer = wire.StepAnswer.refusal(
            entry.step_id,
            _own_fault(f"this node computed NaN or infinite values: {error}", "non_finite_output"),
        )
    except Exception:
        logger.exception("step failed")
        service.cancel(step.session_id)
        answer = wire.StepAnswer.refusal(
            entry.step_id, _own_fault("the step failed on this node", "step_failed")
        )
    else:
        if isinstance(result, Choice):
            answer = wire.StepAnswer.chosen(entry.step_id, result)
        else:
            answer = wire.StepAnswer(
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


async def _cancel(service: NodeService, entry: wire.CancelEntry, answers: _Answers) -> None:
    try:
        if not service.end_session(entry.session_id, _credentials(entry.capability)):
            raise RuntimeRequestError("no such session", code="unknown_session", status=404)
    except RuntimeRequestError as error:
        answers.put(wire.StepAnswer.refusal(entry.step_id, error))
        return
    answers.put(wire.StepAnswer(entry.step_id, status=204))


def _own_fault(message: str, code: str) -> RuntimeRequestError:
    return RuntimeRequestError(message, code=code, status=500, error_type="server_error")
