"""The chat proxy: run one client request along a learned route, with failover.

``ChatProxy.run()`` chooses the route, opens the head node's stream
(``POST {head}/v1/generate``, see docs/adr/0002-node-runtime.md), and yields
the client's ``chat.completion.chunk`` dicts as tokens arrive. Along the way
it emits the console events of the Call wall, and at the end it records the
request, bills it and teaches the router the route's speed.

If a hop dies mid-generation the node is banned with exponential back-off
(a success clears it), a new route is chosen without it, and generation
resumes on the new head by replaying the prompt plus every token already
produced: the client's stream goes on with no gap and no repeated token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import httpx
from channels.db import database_sync_to_async
from django.utils import timezone
from rest_framework import status

from meshnet_site.errors import ApiError, DomainError, http_error
from nodes_app.models import LanguageModel
from routing_app.choice import RouteDecision
from routing_app.services import route_quarantine_node, route_sample_record, route_select
from tracker_app import accounting, console
from tracker_app.billing import HopWork
from tracker_app.chat import ChatParams, completion_chunk
from tracker_app.models import ApiKey

logger = logging.getLogger(__name__)

MAX_FAILOVERS = 3
# A route whose head or hop is at its session cap is waited for, not banned:
# retry with back-off.
BUSY_RETRY_FIRST_SECONDS = 0.05
BUSY_RETRY_MAX_SECONDS = 1.0
BUSY_WAIT_LIMIT_SECONDS = 120.0
PROGRESS_INTERVAL_SECONDS = 0.5
BAN_BASE_SECONDS = 30.0
BAN_MAX_SECONDS = 15 * 60.0
UPSTREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=30.0, pool=30.0)


class HopFailure(Exception):
    """A node of the route failed; the proxy bans it and fails over."""

    def __init__(self, node_id: str, message: str) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.message = message


class RouteBusy(Exception):
    """A node of the route is at its session cap (503): wait for a slot, ban nobody."""


class NodeBans:
    """Consecutive failures per node and the ban each earns: 30 s, 60 s, 120 s… capped."""

    def __init__(self) -> None:
        self._failures: dict[str, int] = {}

    def fail(self, node_id: str) -> float:
        count = self._failures.get(node_id, 0) + 1
        self._failures[node_id] = count
        return min(BAN_MAX_SECONDS, BAN_BASE_SECONDS * 2 ** (count - 1))

    def succeed(self, node_ids: tuple[str, ...]) -> None:
        for node_id in node_ids:
            self._failures.pop(node_id, None)


node_bans = NodeBans()

# Requests this tracker process is streaming from each head: the queue a new
# request joins there, as far as this tracker can see.
_in_flight: Counter[str] = Counter()


@dataclass
class Segment:
    """The part of one request served by one route."""

    decision: RouteDecision
    replayed: int  # tokens produced earlier and prefilled again on this route
    started: float
    produced: int = 0


@dataclass
class Outcome:
    content: str = ""
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: DomainError | None = None
    segments: list[Segment] = field(default_factory=list)

    @property
    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


class ChatProxy:
    """One client request. Iterate ``run()``; read ``outcome`` and ``meshnet`` after."""

    def __init__(
        self,
        *,
        params: ChatParams,
        api_key: ApiKey,
        model: LanguageModel,
        client: httpx.AsyncClient,
        fee_share: Decimal,
        emit: Callable[..., Awaitable[Any]] = console.console_emit,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.params = params
        self.api_key = api_key
        self.model = model
        self.client = client
        self.fee_share = fee_share
        self.emit = emit
        self.clock = clock
        # The record's id is fixed before it exists, so a cancel that races
        # with its creation still finds it (DB calls run in order on one thread).
        self.request_uuid = uuid.uuid4()
        self.request_id = str(self.request_uuid)
        self.completion_id = f"chatcmpl-{self.request_uuid.hex}"
        self.created = int(time.time())
        self.outcome = Outcome()
        self.token_ids: list[int] = []
        self._started = clock()
        self._first_token_at: float | None = None
        self._last_progress = 0.0
        self._busy_since: float | None = None
        self._busy_delay = BUSY_RETRY_FIRST_SECONDS

    @property
    def meshnet(self) -> dict[str, Any]:
        """The ``meshnet`` extension field: the route serving the request now."""
        return self.outcome.segments[-1].decision.to_dict() if self.outcome.segments else {}

    async def start(self) -> None:
        """Choose the first route and open the request record.

        Raises a ``DomainError`` (no route, bad pinned route) before anything is
        streamed, so the client gets a plain error response.
        """
        decision = await database_sync_to_async(route_select)(
            model=self.model, pinned=self.params.route
        )
        await database_sync_to_async(accounting.chat_request_open)(
            request_id=self.request_uuid,
            api_key=self.api_key,
            model=self.model,
            stream=self.params.stream,
            now=timezone.now(),
        )
        self._started = self.clock()
        await self._use(decision, replayed=0)

    async def run(self) -> AsyncIterator[dict[str, Any]]:
        """Client chunks, role first, ``finish_reason`` and usage last.

        A failure with no route left ends the stream with an ``{"error": …}``
        chunk; the request is then recorded failed and not charged.
        """
        yield completion_chunk(
            completion_id=self.completion_id,
            created=self.created,
            model=self.params.model,
            delta={"role": "assistant", "content": ""},
            meshnet=self.meshnet,
        )
        failovers = 0
        try:
            while True:
                try:
                    async for chunk in self._segment():
                        yield chunk
                    break
                except RouteBusy:
                    await self._wait_for_slot()
                except HopFailure as failure:
                    failovers += 1
                    await self._fail_over(failure, exhausted=failovers > MAX_FAILOVERS)
        except DomainError as error:
            self.outcome.error = error
            await self.fail(error.message)
            yield {"error": http_error(error).body["error"]}
            return
        await self._finish_completed()
        yield completion_chunk(
            completion_id=self.completion_id,
            created=self.created,
            model=self.params.model,
            delta={},
            finish_reason=self.outcome.finish_reason,
            usage=self.outcome.usage,
        )

    async def fail(self, message: str, *, cancelled: bool = False) -> None:
        """Record the request failed (or cancelled by the client): never charged.

        Safe to call on any exit path and more than once: only the first call
        that finds the request still processing changes it and tells the
        console.
        """
        failed = await database_sync_to_async(accounting.chat_request_fail)(
            request_id=self.request_uuid, error=message, now=timezone.now(), cancelled=cancelled
        )
        if failed:
            await self.emit(console.ERROR, self.request_id, message=message)

    async def _wait_for_slot(self) -> None:
        """A node of the route is full: wait with back-off, up to the limit."""
        now = self.clock()
        self._busy_since = self._busy_since or now
        if now - self._busy_since > BUSY_WAIT_LIMIT_SECONDS:
            raise ApiError(
                f"The route's nodes stayed at their session cap for "
                f"{BUSY_WAIT_LIMIT_SECONDS:.0f} s; retry later",
                code="route_busy",
                status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
                error_type="server_error",
            )
        await asyncio.sleep(self._busy_delay)
        self._busy_delay = min(BUSY_RETRY_MAX_SECONDS, self._busy_delay * 2)

    async def _use(self, decision: RouteDecision, *, replayed: int) -> None:
        self.outcome.segments.append(
            Segment(decision=decision, replayed=replayed, started=self.clock())
        )
        await database_sync_to_async(accounting.chat_request_route)(
            request_id=self.request_uuid,
            signature=decision.plan.signature,
            mode=str(decision.mode),
        )
        await self.emit(
            console.ROUTE_SELECTED,
            self.request_id,
            model=self.model.key,
            mode=str(decision.mode),
            signature=decision.plan.signature,
            hops=decision.plan.to_dict(),
        )

    async def _segment(self) -> AsyncIterator[dict[str, Any]]:
        """Stream the current route's tokens; raise HopFailure if one of its nodes fails."""
        segment = self.outcome.segments[-1]
        plan = segment.decision.plan
        body = {
            "request_id": self.request_id,
            "messages": self.params.messages,
            "max_tokens": self.params.max_tokens,
            **self.params.sampling(),
            "resume_token_ids": list(self.token_ids),
            "plan": {"model": plan.model_key, "hops": plan.to_dict()},
        }
        head = plan.head
        _in_flight[head.endpoint] += 1
        try:
            async with self.client.stream(
                "POST", f"{head.endpoint}/v1/generate", json=body, timeout=UPSTREAM_TIMEOUT
            ) as response:
                if response.status_code == status.HTTP_503_SERVICE_UNAVAILABLE:
                    raise RouteBusy()
                if response.status_code == status.HTTP_400_BAD_REQUEST:
                    raise _refusal(await response.aread())
                if response.status_code != status.HTTP_200_OK:
                    text = (await response.aread()).decode(errors="replace")[:300]
                    raise HopFailure(head.node_id, f"head answered {response.status_code}: {text}")
                # Connected: waiting for a slot is over, and the route's clock starts.
                self._busy_since, self._busy_delay = None, BUSY_RETRY_FIRST_SECONDS
                segment.started = self.clock()
                await self.emit(console.CONNECTED, self.request_id, endpoint=head.endpoint)
                async for line in response.aiter_lines():
                    try:
                        frame = _sse_payload(line)
                        chunk = None if frame is None else self._absorb(frame, segment)
                    except (ValueError, KeyError, TypeError) as error:
                        raise HopFailure(head.node_id, f"malformed frame: {error}") from error
                    if chunk is not None:
                        yield chunk
                        await self._progress()
        except httpx.HTTPError as error:
            if self.outcome.finish_reason:
                return  # the answer was complete; only the connection's close failed
            raise HopFailure(head.node_id, f"{type(error).__name__}: {error}") from error
        finally:
            _in_flight[head.endpoint] -= 1
        if not self.outcome.finish_reason:
            raise HopFailure(head.node_id, "the head's stream ended before the last token")

    def _absorb(self, frame: dict[str, Any], segment: Segment) -> dict[str, Any] | None:
        """Take one head frame; return the client chunk it becomes, if any."""
        if "error" in frame:
            error = frame["error"]
            if error.get("code") == "hop_busy":
                raise RouteBusy()
            # The head may only blame a node of this route; otherwise it is at fault.
            plan = segment.decision.plan
            blamed = str(error.get("node_id"))
            node_id = blamed if blamed in plan.node_ids else plan.head.node_id
            raise HopFailure(node_id, str(error.get("message", "hop failed")))
        choice = (frame.get("choices") or [{}])[0]
        token_ids = [int(t) for t in frame.get("meshnet_token_ids", [])]
        if len(self.token_ids) + len(token_ids) > self.params.max_tokens:
            raise ValueError(f"the head sent more than the {self.params.max_tokens} tokens asked")
        self.token_ids += token_ids
        segment.produced += len(token_ids)
        if frame.get("usage"):
            self.outcome.prompt_tokens = int(frame["usage"]["prompt_tokens"])
            self.outcome.completion_tokens = len(self.token_ids)
        if choice.get("finish_reason"):
            self.outcome.finish_reason = str(choice["finish_reason"])
        text = (choice.get("delta") or {}).get("content") or ""
        if not text:
            return None
        if self._first_token_at is None:
            self._first_token_at = self.clock()
        self.outcome.content += text
        return completion_chunk(
            completion_id=self.completion_id,
            created=self.created,
            model=self.params.model,
            delta={"content": text},
        )

    async def _progress(self) -> None:
        now = self.clock()
        if now - self._last_progress < PROGRESS_INTERVAL_SECONDS:
            return
        self._last_progress = now
        elapsed = now - self._started
        await self.emit(
            console.PROGRESS,
            self.request_id,
            tokens=len(self.token_ids),
            tokens_per_second=round(len(self.token_ids) / elapsed, 2) if elapsed > 0 else None,
            queue=_in_flight[self.outcome.segments[-1].decision.plan.head.endpoint] - 1,
        )

    async def _fail_over(self, failure: HopFailure, *, exhausted: bool) -> None:
        self._busy_since, self._busy_delay = None, BUSY_RETRY_FIRST_SECONDS
        ban = node_bans.fail(failure.node_id)
        route_quarantine_node(node_id=failure.node_id, seconds=ban)
        logger.warning(
            "hop %s failed (%s); banned for %.0f s", failure.node_id, failure.message, ban
        )
        if exhausted or self.params.route is not None:
            why = "pinned route" if self.params.route is not None else "too many failovers"
            raise ApiError(
                f"Node {failure.node_id} failed mid-generation ({failure.message}); "
                f"no failover ({why})",
                code="upstream_failed",
                status_code=status.HTTP_502_BAD_GATEWAY,
                error_type="upstream_error",
            )
        decision = await database_sync_to_async(route_select)(model=self.model)
        await self._use(decision, replayed=len(self.token_ids))

    async def _finish_completed(self) -> None:
        now = self.clock()
        prompt = self.outcome.prompt_tokens
        work = [
            HopWork(
                node_id=hop.node_id,
                start_layer=hop.start_layer,
                end_layer=hop.end_layer,
                tokens=prompt + segment.replayed + segment.produced,
            )
            for segment in self.outcome.segments
            for hop in segment.decision.plan.hops
            if segment.produced or segment is self.outcome.segments[-1]
        ]
        elapsed = now - self._started
        tps = self.outcome.completion_tokens / elapsed if elapsed > 0 else None
        ttft = (self._first_token_at - self._started) * 1000 if self._first_token_at else None
        await database_sync_to_async(accounting.chat_request_complete)(
            request_id=self.request_uuid,
            model=self.model,
            prompt_tokens=prompt,
            completion_tokens=self.outcome.completion_tokens,
            finish_reason=self.outcome.finish_reason,
            time_to_first_token_ms=ttft,
            tokens_per_second=tps,
            work=work,
            fee_share=self.fee_share,
            now=timezone.now(),
        )
        last = self.outcome.segments[-1]
        route_sample_record(
            decision=last.decision, output_tokens=last.produced, elapsed_seconds=now - last.started
        )
        node_bans.succeed(last.decision.plan.node_ids)
        await self.emit(
            console.COMPLETE,
            self.request_id,
            signature=last.decision.plan.signature,
            completion_tokens=self.outcome.completion_tokens,
            tokens_per_second=round(tps, 2) if tps else None,
            finish_reason=self.outcome.finish_reason,
        )


def _refusal(body: bytes) -> ApiError:
    """The head refused the request itself (too long for the context, a template that
    rejects the messages): the client's error to fix, not a node to ban."""
    try:
        error = json.loads(body)["error"]
        message, code = str(error["message"]), str(error.get("code") or "invalid_request")
    except (ValueError, KeyError, TypeError):
        message, code = body.decode(errors="replace")[:300], "invalid_request"
    return ApiError(f"The model's node refused the request: {message}", code=code)


def _sse_payload(line: str) -> dict[str, Any] | None:
    """The JSON of one ``data:`` line; None for blank lines, comments and ``[DONE]``."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    payload = json.loads(data)
    return payload if isinstance(payload, dict) else None
