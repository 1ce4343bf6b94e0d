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

from meshnet_site.errors import ApiError
from routing_app.choice import RouteDecision
from routing_app.models import LanguageModel
from routing_app.services import route_quarantine_node, route_sample_record, route_select
from tracker_app import accounting, console
from tracker_app.billing import HopWork
from tracker_app.chat import ChatParams, completion_chunk
from tracker_app.models import ApiKey, ChatRequest

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
    error: ApiError | None = None
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
        self.completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.outcome = Outcome()
        self.record: ChatRequest | None = None
        self.token_ids: list[int] = []
        self._first_token_at: float | None = None
        self._last_progress = 0.0

    @property
    def request_id(self) -> str:
        return str(self.record.pk) if self.record else self.completion_id

    @property
    def meshnet(self) -> dict[str, Any]:
        """The ``meshnet`` extension field: the route serving the request now."""
        return self.outcome.segments[-1].decision.to_dict() if self.outcome.segments else {}

    async def start(self) -> None:
        """Choose the first route and open the request record.

        Raises ``ApiError`` (no route, bad pinned route) before anything is
        streamed, so the client gets a plain error response.
        """
        decision = await database_sync_to_async(route_select)(
            model=self.model, pinned=self.params.route
        )
        self.record = await database_sync_to_async(accounting.chat_request_open)(
            api_key=self.api_key, model=self.model, stream=self.params.stream, now=timezone.now()
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
        busy_since: float | None = None
        busy_delay = BUSY_RETRY_FIRST_SECONDS
        try:
            while True:
                try:
                    async for chunk in self._segment():
                        yield chunk
                    break
                except RouteBusy:
                    busy_since = busy_since or self.clock()
                    if self.clock() - busy_since > BUSY_WAIT_LIMIT_SECONDS:
                        raise ApiError(
                            "Every slot of the route's head stayed busy for "
                            f"{BUSY_WAIT_LIMIT_SECONDS:.0f} s; retry later",
                            code="route_busy",
                            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
                            error_type="server_error",
                        ) from None
                    await asyncio.sleep(busy_delay)
                    busy_delay = min(BUSY_RETRY_MAX_SECONDS, busy_delay * 2)
                except HopFailure as failure:
                    failovers += 1
                    await self._fail_over(failure, exhausted=failovers > MAX_FAILOVERS)
        except ApiError as error:
            self.outcome.error = error
            await self._finish_failed(error.message)
            yield {"error": error.body()["error"]}
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

    async def cancel(self) -> None:
        """The client went away: nothing is charged, nothing is learned."""
        if self.record is not None:
            await database_sync_to_async(accounting.chat_request_fail)(
                request=self.record, error="client disconnected", now=timezone.now(), cancelled=True
            )
            await self.emit(console.ERROR, self.request_id, message="client disconnected")

    async def _use(self, decision: RouteDecision, *, replayed: int) -> None:
        self.outcome.segments.append(
            Segment(decision=decision, replayed=replayed, started=self.clock())
        )
        assert self.record is not None
        await database_sync_to_async(accounting.chat_request_route)(
            request=self.record, signature=decision.plan.signature, mode=str(decision.mode)
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
                if response.status_code != status.HTTP_200_OK:
                    text = (await response.aread()).decode(errors="replace")[:300]
                    raise HopFailure(head.node_id, f"head answered {response.status_code}: {text}")
                await self.emit(console.CONNECTED, self.request_id, endpoint=head.endpoint)
                async for line in response.aiter_lines():
                    frame = _sse_payload(line)
                    if frame is None:
                        continue
                    chunk = self._absorb(frame, segment)
                    if chunk is not None:
                        yield chunk
                        await self._progress()
        except httpx.HTTPError as error:
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
            node_id = str(error.get("node_id") or segment.decision.plan.head.node_id)
            raise HopFailure(node_id, str(error.get("message", "hop failed")))
        choice = (frame.get("choices") or [{}])[0]
        token_ids = [int(t) for t in frame.get("meshnet_token_ids", [])]
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
        assert self.record is not None
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
            request=self.record,
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

    async def _finish_failed(self, message: str) -> None:
        if self.record is not None:
            await database_sync_to_async(accounting.chat_request_fail)(
                request=self.record, error=message, now=timezone.now()
            )
        await self.emit(console.ERROR, self.request_id, message=message)


def _sse_payload(line: str) -> dict[str, Any] | None:
    """The JSON of one ``data:`` line; None for blank lines, comments and ``[DONE]``."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    payload = json.loads(data)
    return payload if isinstance(payload, dict) else None
