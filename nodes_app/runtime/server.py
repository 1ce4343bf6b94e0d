"""The node's ASGI app (Starlette): health, challenges, the hop link, and head generation.

Routes:
  GET    /v1/health               shard, sessions, queue depth, throughput, KV use and
                                  prefix cache in quarters (open to anyone: no exact
                                  free KV), prefix cache hits
  POST   /v1/challenge            sign the tracker's nonce with the wallet (ADR-0008; open)
  WS     /v1/link                 a head's link: frames of hop steps, prefix claims and
                                  session cancels
                                  (binary, see ``wire`` and ``hop.link_server``)
  POST   /v1/generate             head only: run a plan, stream chat chunks (SSE)
Every HTTP refusal is ``{"error": {"message", "type", "code"}}`` with a 4xx/5xx
status: a 4xx only for the requester's fault, a 5xx for this node's; a step's
refusal on the link carries the same status, code and type in its answer.
Generate, steps and cancels need the tracker's signed plan or the session's
capability (``engine.trust``), checked before anything else; a generate body is read
to at most ``max_request_bytes`` (413), a link frame to at most
``max_frame_bytes`` (the link closes). Both happen before a session slot is taken. A
link is kept only by a head that shows a valid plan or capability (``hop.link_guard``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from nodes_app.protocol.decoding import json_document
from nodes_app.protocol.limits import LINK_MAX_FRAME_BYTES, LINK_PATH
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.head.hop_links import HopLinks
from nodes_app.runtime.head.request_checks import HeadIdentity, check_grant, parse_generate_request
from nodes_app.runtime.head.route_driver import RouteDriver, prompt_for
from nodes_app.runtime.head.speculation import TimingBook
from nodes_app.runtime.hop.link_guard import LinkPolicy, PeerLinks
from nodes_app.runtime.hop.link_server import serve_link
from nodes_app.shared.signing import is_challenge_nonce, sign_challenge, wallet_of

logger = logging.getLogger("meshnet.node")

# A challenge body is one 64-hex nonce; anything much larger is not one.
MAX_CHALLENGE_BYTES = 1024
# What /v1/health tells anyone of the KV budget: the share in use, rounded up to
# one of this many steps. The exact figures would let a stranger size a request
# that fills exactly what is left; a quarter is enough to see a node
# filling up, and no attacker learns from it what to send.
KV_LOAD_STEPS = 4
# The exact figures stay off the open page (the in-process NodeService.health()
# keeps them, for tests and operators' tools running beside the node).
PRIVATE_HEALTH_FIELDS = ("kv_budget_bytes", "kv_reserved_bytes", "prefix_cache")


def _load(used: int, budget: int) -> float:
    """``used`` as a share of ``budget``, rounded up to a quarter (0 only when nothing is)."""
    share = used / budget if budget > 0 else 1.0
    return min(KV_LOAD_STEPS, math.ceil(share * KV_LOAD_STEPS)) / KV_LOAD_STEPS


def public_health(health: dict[str, Any]) -> dict[str, Any]:
    """``NodeService.health()`` as anyone may read it: the KV budget in use only as
    ``kv_load``, a share rounded up to a quarter (0 only when nothing is reserved);
    the prefix cache (ADR-0027) as the share of the budget it holds, rounded the
    same way, and its count of hits (its entries, bytes and reused positions stay
    off: what it holds is what requests asked)."""
    budget = health["kv_budget_bytes"]
    prefix = health["prefix_cache"]
    public = {name: value for name, value in health.items() if name not in PRIVATE_HEALTH_FIELDS}
    return {
        **public,
        "kv_load": _load(health["kv_reserved_bytes"], budget),
        "prefix_cache_load": _load(prefix["bytes"], budget),
        "prefix_hits": prefix["hits"],
    }


@dataclass(frozen=True)
class NodeIdentity:
    """The wallet a node answers endpoint challenges with, and the endpoint it advertises."""

    key: Ed25519PrivateKey
    endpoint: str


def _error(error: RuntimeRequestError) -> JSONResponse:
    headers = {"Retry-After": "1"} if error.status == 503 else {}
    if error.status == 413:
        # The body is refused unread: closing stops the sender instead of draining it.
        headers["Connection"] = "close"
    return JSONResponse(error.as_json(), status_code=error.status, headers=headers)


async def _bounded_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it is known to pass ``limit`` bytes (never read past it)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def _too_large(limit: int) -> RuntimeRequestError:
    return RuntimeRequestError(
        f"the body is larger than the {limit} bytes this node reads",
        code="request_too_large",
        status=413,
    )


def create_app(
    service: NodeService,
    *,
    reap_interval: float | None = None,
    identity: NodeIdentity | None = None,
    max_frame_bytes: int = LINK_MAX_FRAME_BYTES,
    link_policy: LinkPolicy | None = None,
) -> Starlette:
    """The ASGI app serving ``service``; as a head it keeps one link per downstream hop.

    ``identity`` is the wallet that answers ``/v1/challenge``; a node without
    one (served without a tracker) answers it 404 ``no_wallet``.
    ``max_frame_bytes`` bounds a link frame, both ways (serve it with the same
    websocket ``max_size``, so that a larger one is never read whole).
    ``link_policy`` says who may hold a link and for how long (``hop.link_guard``).
    """
    state: dict[str, Any] = {}
    peers = PeerLinks(link_policy or LinkPolicy())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["links"] = HopLinks(max_frame_bytes=max_frame_bytes)
        # Each route's step timing, from which a generation chooses its drafts (ADR-0028).
        state["timings"] = TimingBook()
        # At least every second: a session ends within a second of its plan's bounds.
        interval = reap_interval or max(0.2, min(1.0, service.store.idle_timeout / 4))
        reaper = asyncio.create_task(_reap(service, interval))
        try:
            yield
        finally:
            reaper.cancel()
            await state["links"].aclose()
            service.close()

    async def health(request: Request) -> JSONResponse:
        return JSONResponse(public_health(service.health()))

    async def challenge(request: Request) -> Response:
        # Open to anyone, like /v1/health: the signature covers only the
        # challenge domain, the nonce and this node's endpoint, so it proves
        # where this wallet serves and can be used for nothing else.
        if identity is None:
            return _error(
                RuntimeRequestError(
                    "this node has no wallet: it cannot prove an endpoint",
                    code="no_wallet",
                    status=404,
                )
            )
        try:
            declared = request.headers.get("content-length", "")
            if not declared.isdigit() or int(declared) > MAX_CHALLENGE_BYTES:
                raise RuntimeRequestError(
                    f"a challenge is a JSON body of at most {MAX_CHALLENGE_BYTES} bytes",
                    code="invalid_request",
                )
            try:
                body = await request.json()
            except ValueError:
                raise RuntimeRequestError("body is not JSON", code="invalid_json") from None
            nonce = body.get("nonce") if isinstance(body, dict) else None
            if not is_challenge_nonce(nonce):
                raise RuntimeRequestError(
                    "nonce must be 64 lowercase hex digits", code="invalid_nonce"
                )
            signature = sign_challenge(identity.key, nonce, identity.endpoint)
        except RuntimeRequestError as error:
            return _error(error)
        return JSONResponse({"wallet": wallet_of(identity.key), "signature": signature})

    async def generate(request: Request) -> Response:
        if not service.can_head:
            return _error(
                RuntimeRequestError(
                    "this node does not start at layer 0: it cannot be a head", code="not_head"
                )
            )
        shard = service.shard
        head = HeadIdentity(
            node_id=service.node_id,
            model_key=shard.model_key,
            shard_start=shard.start,
            shard_end=shard.end,
            num_layers=shard.num_layers,
            vocab_size=int(shard.config.vocab_size),
            max_prompt_chars=service.max_prompt_chars,
        )
        try:
            raw = await _bounded_body(request, service.max_request_bytes)
            try:
                body = json_document(raw)
            except ValueError:
                raise RuntimeRequestError("body is not JSON", code="invalid_json") from None
            generate_request = parse_generate_request(body, head)
            service.gate.admit_plan(generate_request.plan, node_id=service.node_id)
            prompt = await prompt_for(service, generate_request)
            check_grant(generate_request, len(prompt))
            generation = RouteDriver(
                service, state["links"], generate_request, prompt, timings=state["timings"]
            )
        except RuntimeRequestError as error:
            return _error(error)
        return _SSEResponse(generation.stream(), media_type="text/event-stream")

    async def link(websocket: WebSocket) -> None:
        await serve_link(websocket, service, max_frame_bytes=max_frame_bytes, peers=peers)

    return Starlette(
        routes=[
            Route("/v1/health", health, methods=["GET"]),
            Route("/v1/challenge", challenge, methods=["POST"]),
            WebSocketRoute(LINK_PATH, link),
            Route("/v1/generate", generate, methods=["POST"]),
        ],
        lifespan=lifespan,
    )


class _SSEResponse(StreamingResponse):
    """Closes the stream's generator when the client goes away, so cancels run at once."""

    async def stream_response(self, send: Any) -> None:
        try:
            await super().stream_response(send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(aclose())

    def init_headers(self, headers: Any = None) -> None:
        super().init_headers(headers)
        self.raw_headers.append((b"cache-control", b"no-cache"))


async def _reap(service: NodeService, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        freed = service.reap_idle()
        if freed:
            logger.info("freed %d idle sessions", len(freed))
