"""A test's end of a hop link: steps sent as a head sends them, answers read back.

Frames are the product's (``nodes_app.runtime.wire``); the websocket is either the in-process
app's (Starlette's TestClient) or a real node process's (``websockets``'
sync client). Sync, because the tests calling it are.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from starlette.testclient import TestClient
from websockets.sync.client import connect

from nodes_app.protocol.limits import LINK_PATH
from nodes_app.protocol.sampling import SamplingParams
from nodes_app.runtime.head.hop_links import link_url
from nodes_app.runtime.wire.entries import (
    CancelEntry,
    ClaimEntry,
    ForwardStep,
    LinkStep,
    StepAnswer,
)
from nodes_app.runtime.wire.frames import decode_answers, encode_requests

HIDDEN = 64  # the tiny model's hidden size


def tiny_step(
    session: str,
    rows: int,
    *,
    start: int = 2,
    end: int = 3,
    position: int = 0,
    dtype: str = "float32",
    sender: str | None = None,
) -> ForwardStep:
    """One hop step of the tiny model (sampling only when it ends at the last layer)."""
    return ForwardStep(
        session_id=session,
        start=start,
        end=end,
        position=position,
        dtype=dtype,
        shape=(1, rows, HIDDEN),
        sampling=SamplingParams() if end == 3 else None,
        sender=sender,
    )


class LinkClient:
    """Sends frames and waits for every entry's answer (several frames may carry them)."""

    def __init__(self, send: Callable[[bytes], None], receive: Callable[[], bytes]) -> None:
        self._send = send
        self._receive = receive
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    def exchange(self, entries: Sequence[LinkStep | CancelEntry | ClaimEntry]) -> list[StepAnswer]:
        """Send ``entries`` as one frame; their answers, in the entries' order."""
        self._send(encode_requests(entries))
        return self.answers([entry.step_id for entry in entries])

    def send_frame(self, frame: bytes) -> None:
        self._send(frame)

    def answers(self, ids: list[int]) -> list[StepAnswer]:
        got: dict[int, StepAnswer] = {}
        while not set(ids) <= set(got):
            for answer in decode_answers(self._receive()):
                got[answer.step_id] = answer
        return [got[step_id] for step_id in ids]

    def step(
        self,
        step: ForwardStep,
        body: bytes,
        *,
        capability: str | None = None,
        plan: str | None = None,
    ) -> StepAnswer:
        [answer] = self.exchange([LinkStep(self.next_id(), step, body, capability, plan)])
        return answer

    def cancel(
        self, session: str, *, capability: str | None = None, keep: Sequence[str] | None = None
    ) -> StepAnswer:
        kept = None if keep is None else tuple(keep)
        [answer] = self.exchange([CancelEntry(self.next_id(), session, capability, kept)])
        return answer

    def claim(
        self,
        session: str,
        hashes: Sequence[str],
        *,
        start: int = 2,
        end: int = 3,
        reserve: int = 64,
        capability: str | None = None,
        plan: str | None = None,
    ) -> StepAnswer:
        """Open ``session`` with a prefix claim (ADR-0027): the blocks the hop holds."""
        entry = ClaimEntry(
            self.next_id(), session, start, end, reserve, tuple(hashes), capability, plan
        )
        [answer] = self.exchange([entry])
        return answer

    def raw_step(
        self,
        fields: dict[str, Any],
        body: bytes,
        *,
        capability: str | None = None,
        plan: str | None = None,
    ) -> StepAnswer:
        """A step whose fields are written by hand (malformed ones included)."""
        step_id = self.next_id()
        entry = {"id": step_id, "bytes": len(body), "step": fields}
        entry.update({k: v for k, v in (("capability", capability), ("plan", plan)) if v})
        header = json.dumps({"steps": [entry]})
        self._send(struct.pack("<I", len(header)) + header.encode() + body)
        [answer] = self.answers([step_id])
        return answer


@contextlib.contextmanager
def in_process_link(client: TestClient) -> Iterator[LinkClient]:
    """A link to the app ``client`` serves in process."""
    with client.websocket_connect(LINK_PATH) as websocket:
        yield LinkClient(websocket.send_bytes, websocket.receive_bytes)


@contextlib.contextmanager
def node_link(endpoint: str, *, timeout: float = 60.0) -> Iterator[LinkClient]:
    """A link to a node process at ``endpoint``."""
    with connect(link_url(endpoint), max_size=None, compression=None) as websocket:

        def receive() -> bytes:
            message = websocket.recv(timeout=timeout)
            assert isinstance(message, bytes)
            return message

        yield LinkClient(websocket.send, receive)
