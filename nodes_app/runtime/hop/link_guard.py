"""Who may hold a hop link, and for how long: the rules ``link_server`` closes links by.

A link costs the node a socket, buffers and event-loop time for every frame it
decodes, so only a head holding a tracker-signed plan (or a session's
capability) keeps one:

- at most ``max_per_peer`` links from one peer address at once (a further one
  is refused at the handshake, HTTP 403), and none for ``hello_seconds`` once
  the node closed ``max_per_peer`` of its links within ``hello_seconds`` for
  showing nothing valid;
- a link must show a valid plan or capability on its first frame, within
  ``hello_seconds`` of opening (a head's hello, ``wire.entries.HelloEntry``, or any
  valid entry); until it has, frames over ``LINK_FIRST_FRAME_BYTES`` are
  refused as they arrive (:class:`Connection`), its fifth refused entry
  (``stranger_refusals`` + 1) closes it, and its frames are decoded in turn
  with other strangers' frames, each turn followed by a pause twice as long
  (:meth:`PeerLinks.stranger_turn`):
  strangers get at most a third of the event loop, honest links' frames never
  wait on them;
- a link that has shown one is closed once its refused entries pass
  ``max_refusals`` (plus one per 64 admitted), so a head cannot follow one
  valid plan with a stream of forged ones each costing a signature check;
- a link that carried no valid step (and has none running) for
  ``idle_seconds`` is closed with ``LINK_CLOSE_IDLE`` (the head resends);
- a link that has shown one reads ahead while its unread frames hold at most
  ``read_ahead_bytes`` (``link_inbox``), a stranger's one frame at a time;
- a link whose peer does not read its answers (answers waiting past
  ``send_buffer_bytes`` behind the frame being written, or no frame written for
  ``write_seconds`` while some wait) is aborted.

Torch-free: ``manage.py runnode`` registers these options when Django loads.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.limits import CAPABILITY, PLAN
from nodes_app.protocol.signed_plan import SignedPlan
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.hop.link_inbox import Inbox


@dataclass(frozen=True)
class LinkPolicy:
    """A node's limits on the links it serves (``runnode`` ``--link-*`` options)."""

    hello_seconds: float = 5.0
    idle_seconds: float = 60.0
    max_per_peer: int = 8
    send_buffer_bytes: int = 16 * 2**20
    write_seconds: float = 15.0
    max_refusals: int = 16
    # Refused entries a link may send before it shows anything valid (each may cost a
    # signature check): enough for a test client's refusals, few for a flood.
    stranger_refusals: int = 4
    # Bytes of frames a link that has shown one may have waiting unread while its socket
    # keeps reading (``link_inbox``); a stranger's link reads one frame at a time.
    read_ahead_bytes: int = 2**20

    def refusals_allowed(self, admitted: int) -> int:
        """Refused entries a link that had ``admitted`` valid ones may send before it closes."""
        return self.max_refusals + admitted // 64


class PeerLinks:
    """The links open per peer address, the addresses barred for a while, and the turn
    strangers' frames are decoded in."""

    # Addresses remembered at most, struck or barred (what no longer counts is dropped past it).
    MAX_REMEMBERED = 65_536

    def __init__(self, policy: LinkPolicy, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._open: dict[str, int] = {}
        self._barred: dict[str, float] = {}
        # Per address: links closed for showing nothing valid, since when.
        self._strikes: dict[str, tuple[int, float]] = {}
        self._strangers = asyncio.Lock()

    def enter(self, host: str) -> str | None:
        """Count a new link from ``host``; why it is refused (not counted), or None."""
        until = self._barred.get(host)
        if until is not None:
            if self._clock() < until:
                return "its links keep showing no valid plan or capability"
            del self._barred[host]
        held = self._open.get(host, 0)
        if held >= self.policy.max_per_peer:
            return f"{held} links from that address are open"
        self._open[host] = held + 1
        return None

    def leave(self, host: str) -> None:
        held = self._open.get(host, 0) - 1
        if held > 0:
            self._open[host] = held
        else:
            self._open.pop(host, None)

    def strike(self, host: str) -> None:
        """Count a link of ``host`` closed for showing nothing valid: the ``max_per_peer``-th
        within a hello timeout bars the address for the next hello timeout."""
        now = self._clock()
        count, since = self._strikes.get(host, (0, now))
        if now - since > self.policy.hello_seconds:
            count, since = 0, now
        count += 1
        if count < self.policy.max_per_peer:
            if len(self._strikes) >= self.MAX_REMEMBERED:
                self._forget(now)
            self._strikes[host] = (count, since)
            return
        self._strikes.pop(host, None)
        if len(self._barred) >= self.MAX_REMEMBERED:
            self._forget(now)
        self._barred[host] = now + self.policy.hello_seconds

    def _forget(self, now: float) -> None:
        """Drop what no longer counts (past strikes, expired bars)."""
        horizon = now - self.policy.hello_seconds
        self._strikes = {h: c for h, c in self._strikes.items() if c[1] > horizon}
        self._barred = {h: until for h, until in self._barred.items() if until > now}

    @contextlib.asynccontextmanager
    async def stranger_turn(self) -> AsyncIterator[None]:
        """Decode one frame of a link that has shown nothing valid yet, one at a time,
        then pause twice as long as that took before the next stranger's turn."""
        async with self._strangers:
            started = time.perf_counter()
            yield
            await asyncio.sleep(2 * (time.perf_counter() - started))


class Connection:
    """What the link server reaches of its own connection below ASGI, under uvicorn.

    Under uvicorn's ``websockets-sansio`` the task serving a websocket is the
    connection's ``run_asgi``, whose protocol (its ``self``) holds the
    transport and the websockets parser. Made in that task (not in one of its
    own), this handle can abort the socket (a graceful close waits for the
    peer to read what is queued: forever, for a peer that never reads), set
    the largest message the parser takes (one past it is refused as it
    arrives, unread: 1009) and write an answer frame without the ASGI send's
    coroutines. Elsewhere (another server, a test client) all do nothing
    and say so.
    """

    def __init__(self) -> None:
        task = asyncio.current_task()
        coro: Any = task.get_coro() if task is not None else None
        frame = getattr(coro, "cr_frame", None)
        protocol = frame.f_locals.get("self") if frame is not None else None
        transport = getattr(protocol, "transport", None)
        self._transport = transport if isinstance(transport, asyncio.Transport) else None
        parser = getattr(protocol, "conn", None)
        self._parser = parser if isinstance(getattr(parser, "max_size", None), int) else None
        writable = getattr(protocol, "writable", None)
        self._protocol = (
            protocol
            if self._transport is not None
            and self._parser is not None
            and isinstance(writable, asyncio.Event)
            and hasattr(protocol, "close_sent")
            and hasattr(protocol, "disconnected")
            else None
        )

    def inbox(self) -> Inbox | None:
        """Take over the connection's receive queue (:class:`link_inbox.Inbox`, reading
        one frame at a time until its ``read_ahead`` is raised); None if it cannot."""
        protocol = self._protocol
        queue = getattr(protocol, "queue", None)
        if protocol is None or not isinstance(queue, asyncio.Queue):
            return None
        inbox = Inbox(protocol.transport, protocol)
        while not queue.empty():
            inbox.put_nowait(queue.get_nowait())
        protocol.queue = inbox
        return inbox

    def abort(self) -> bool:
        """Drop the socket at once, its unsent bytes discarded; False if there is none."""
        if self._transport is None:
            return False
        self._transport.abort()
        return True

    def send_now(self, message: bytes) -> bool:
        """Write ``message`` as one binary websocket message at once, as uvicorn's own
        ``send`` would, when the socket takes it without waiting (not paused for a
        peer that reads slowly, not closing); False, nothing written, otherwise.

        The ASGI ``send`` it stands for costs a coroutine through every
        middleware per answer frame; a hop's answers are on every token's path.
        """
        protocol = self._protocol
        if (
            protocol is None
            or protocol.disconnected
            or protocol.close_sent
            or not protocol.writable.is_set()
            or protocol.transport.is_closing()
        ):
            return False
        protocol.conn.send_binary(message)
        protocol.transport.write(b"".join(protocol.conn.data_to_send()))
        return True

    def limit_messages(self, max_bytes: int) -> bool:
        """Refuse messages over ``max_bytes`` as they arrive; False if it cannot."""
        if self._parser is None:
            return False
        self._parser.max_size = max_bytes
        return True


def check_plan_shown(
    gate: PlanGate, credentials: Mapping[str, str], *, node_id: str, session_id: str
) -> None:
    """Refuse (401/403/400) unless ``credentials`` hold a plan sealed by the pinned key
    that names ``node_id`` as a downstream hop, for the request ``session_id`` is of.

    A hello shows the plan its first step will open a session with; this does
    not use the plan up (the step does), and the layers are the step's to match.
    """
    raw = credentials.get(PLAN)
    if not raw:
        raise RuntimeRequestError(
            f"a link opens with {PLAN} or a session's {CAPABILITY}",
            code="plan_required",
            status=401,
            error_type="authentication_error",
        )
    try:
        plan = SignedPlan.from_header(raw)
    except ProtocolError as error:
        raise RuntimeRequestError.refusing(error) from None
    gate.verify(plan)  # the seal: the pinned key, unexpired, not valid too long
    named = any(hop.node_id == node_id for hop in plan.hops[1:])
    if not named or not session_id.startswith(plan.request_id + "."):
        raise RuntimeRequestError(
            f"the plan has no hop on this node ({node_id}) for this session",
            code="plan_mismatch",
            status=403,
            error_type="permission_error",
        )


# --- command-line options (runnode and python -m nodes_app.runtime) -------------------

_DEFAULT = LinkPolicy()


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not 0 < seconds <= 86_400:
        raise argparse.ArgumentTypeError("must be more than 0 and at most 86400 seconds")
    return seconds


def _count(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {value!r}")
    return int(value)


def add_link_arguments(parser: argparse.ArgumentParser) -> None:
    """``--link-hello-timeout``, ``--link-idle-timeout``, ``--max-links-per-peer``,
    ``--link-send-buffer``, ``--link-write-timeout``."""
    parser.add_argument(
        "--link-hello-timeout",
        type=_seconds,
        default=_DEFAULT.hello_seconds,
        metavar="SECONDS",
        help="a hop link must show a valid plan or capability on its first frame within this "
        f"long, or it is closed (default {_DEFAULT.hello_seconds:g})",
    )
    parser.add_argument(
        "--link-idle-timeout",
        type=_seconds,
        default=_DEFAULT.idle_seconds,
        metavar="SECONDS",
        help="a hop link that carried no valid step for this long is closed; the head opens "
        f"a new one when it needs one (default {_DEFAULT.idle_seconds:g})",
    )
    parser.add_argument(
        "--max-links-per-peer",
        type=_count,
        default=_DEFAULT.max_per_peer,
        metavar="N",
        help="hop links one peer address may hold open at once; a further one is refused "
        f"(default {_DEFAULT.max_per_peer})",
    )
    parser.add_argument(
        "--link-send-buffer",
        type=_count,
        default=_DEFAULT.send_buffer_bytes,
        metavar="BYTES",
        help="answer bytes a hop link may leave waiting behind the frame being written; "
        f"a peer that lets more pile up is cut off (default {_DEFAULT.send_buffer_bytes})",
    )
    parser.add_argument(
        "--link-write-timeout",
        type=_seconds,
        default=_DEFAULT.write_seconds,
        metavar="SECONDS",
        help="a hop link on which no answer frame could be written for this long while some "
        f"wait is cut off (default {_DEFAULT.write_seconds:g})",
    )


def link_policy_from(options: Any) -> LinkPolicy:
    """The policy ``add_link_arguments``' options name (argparse namespace or Django's dict)."""
    values = options if isinstance(options, dict) else vars(options)
    return LinkPolicy(
        hello_seconds=values["link_hello_timeout"],
        idle_seconds=values["link_idle_timeout"],
        max_per_peer=values["max_links_per_peer"],
        send_buffer_bytes=values["link_send_buffer"],
        write_seconds=values["link_write_timeout"],
    )
