"""A completion proxy against fake heads: what the client streams, what the console hears.

The heads are faked at the HTTP boundary (``httpx.MockTransport``) and speak
the real protocol: :class:`FakeHeads` parses the tracker's
``GenerateRequest`` and answers with the protocol's frames, as scripted per
node (:class:`Behaviour`). :class:`Net` is the test network (a model, its
nodes, the route stats store) and builds
:class:`~tracker_app.completions.proxy.CompletionProxy` objects on it whose
console events it keeps; :func:`serve` relays a request as the consumer
would. Routing, quarantine, accounting and billing are the real ones, over
the test database.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import httpx
import pytest
from django.utils import timezone

from nodes_app.models import LanguageModel, Node, TopologyEpoch
from nodes_app.protocol.frames import ChunkFrame, ErrorFrame
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.sse import SSE_DONE, sse_data, sse_event
from nodes_app.protocol.usage import Usage
from routing_app.exclusions import bans
from routing_app.exclusions.bans import NodeBans
from routing_app.learning.stats import RouteStatsStore
from tests.support.routing import process_store
from tracker_app.api_keys.services import api_key_create
from tracker_app.completions import console
from tracker_app.completions.answers import AnswerKind
from tracker_app.completions.busy_claims import BUSY_CLAIMS
from tracker_app.completions.chat_answer import ChatAnswer
from tracker_app.completions.chat_request import chat_params_parse
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.proxy import CompletionProxy
from tracker_app.completions.proxy_terms import CompletionRequest, CompletionResult, ProxySettings
from tracker_app.completions.text_answer import TextCompletionAnswer
from tracker_app.completions.text_request import text_completion_params_parse
from tracker_app.models import ChatRequest, WorkUnit

PROMPT_TOKENS = 7  # what the fake head reports for any prompt
_models = itertools.count()


def token_id(position: int) -> int:
    """The fake model's token at completion position ``position``."""
    return 100 + position


def token_text(position: int) -> str:
    return f"w{position} "


def answer(max_tokens: int) -> str:
    """The whole completion the fake model gives, whichever head runs it."""
    return "".join(token_text(i) for i in range(max_tokens))


# --- the fake head ------------------------------------------------------------


# The start of a line a fake head never ends (``Behaviour(then="endless")``).
ENDLESS = b"data: "


class EventStream(httpx.AsyncByteStream):
    """SSE bytes, then optionally a connection error, as a dying head would send."""

    def __init__(
        self,
        events: list[bytes],
        error: Exception | None,
        closed: list[str],
        node: str,
        gap: float = 0.0,
    ):
        self.events, self.error, self.closed, self.node = events, error, closed, node
        self.gap = gap  # seconds between two events, as a head's steps take time

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for index, event in enumerate(self.events):
            if index and self.gap:
                await asyncio.sleep(self.gap)
            yield event
        if self.error is not None:
            raise self.error
        if self.events[-1] == ENDLESS:
            while True:  # a line that never ends, as fast as it is read
                yield b"x" * 65536
        if not self.events[-1].startswith(sse_event(SSE_DONE)):
            await asyncio.Event().wait()  # a head still generating, as long as it takes

    async def aclose(self) -> None:
        self.closed.append(self.node)


@dataclass
class Behaviour:
    """What a fake head does with one request (the default: answer it all)."""

    status: int = 200
    tokens: int | None = None  # stop after this many new tokens…
    # …and then: "die", "blame:<node>", "busy", "garbage", "hang", "endless" (a line
    # without end)
    then: str = "done"
    connect_error: bool = False
    body: dict[str, Any] | None = None
    message: str = "failed"  # an error frame's message
    code: str = "hop_failed"  # an error frame's code
    gap: float = 0.0  # seconds between two frames
    texts: tuple[str, ...] = ()  # the first tokens' text, instead of the fake model's
    speculated: tuple[int, int] = (0, 0)  # drafts its usage reports sent and accepted


@dataclass
class FakeHeads:
    """Every head of the test network; ``plan(node, Behaviour, …)`` scripts its next calls."""

    scripts: dict[str, list[Behaviour]] = field(default_factory=dict)
    requests: list[GenerateRequest] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    def plan(self, node_id: str, *behaviours: Behaviour) -> None:
        self.scripts.setdefault(node_id, []).extend(behaviours)

    def heads_asked(self) -> list[str]:
        return [request.hops[0].node_id for request in self.requests]

    async def __call__(self, http_request: httpx.Request) -> httpx.Response:
        request = GenerateRequest.parse(json.loads(http_request.content))
        self.requests.append(request)
        node = request.hops[0].node_id
        script = self.scripts.get(node) or [Behaviour()]
        behaviour = script.pop(0) if len(script) > 1 else script[0]
        if behaviour.connect_error:
            raise httpx.ConnectError("connection refused", request=http_request)
        if behaviour.status != 200:
            return httpx.Response(behaviour.status, json=behaviour.body or {})
        events, error = self._events(request, behaviour)
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=EventStream(events, error, self.closed, node, gap=behaviour.gap),
        )

    def _events(
        self, request: GenerateRequest, behaviour: Behaviour
    ) -> tuple[list[bytes], Exception | None]:
        def encode(frame: ChunkFrame) -> bytes:
            return sse_event(frame.to_json(completion_id="head-1", created=1, model=request.model))

        first = len(request.resume_token_ids)
        last = request.max_tokens - 1
        stop = last if behaviour.tokens is None else first + behaviour.tokens - 1
        events = [encode(ChunkFrame(role="assistant"))]
        for position in range(first, min(stop, last) + 1):
            done = position == last
            events.append(
                encode(
                    ChunkFrame(
                        content=(
                            behaviour.texts[position]
                            if position < len(behaviour.texts)
                            else token_text(position)
                        ),
                        token_ids=(token_id(position),),
                        finish_reason="length" if done else None,
                        usage=(
                            Usage(
                                PROMPT_TOKENS,
                                position + 1,
                                drafted_tokens=behaviour.speculated[0],
                                accepted_tokens=behaviour.speculated[1],
                            )
                            if done
                            else None
                        ),
                    )
                )
            )
        if behaviour.then.startswith("blame:"):
            blamed = behaviour.then.removeprefix("blame:")
            frame = ErrorFrame(
                f"hop {blamed} {behaviour.message}", code=behaviour.code, node_id=blamed
            )
            events.append(sse_event(frame.to_json()))
        elif behaviour.then == "busy":
            events.append(sse_event(ErrorFrame("full", code="hop_busy", node_id="x").to_json()))
        elif behaviour.then == "garbage":
            events.append(b"data: {not json\n\n")
        elif behaviour.then == "endless":
            return [*events, ENDLESS], None
        if behaviour.then == "die":
            return events, httpx.ReadError("peer closed the connection")
        if behaviour.then == "hang":
            return events, None
        return [*events, sse_event(SSE_DONE)], None


# --- the network --------------------------------------------------------------


@dataclass
class Net:
    model: LanguageModel
    store: RouteStatsStore
    heads: FakeHeads
    events: list[tuple[str, dict[str, Any]]]
    # Called with each console event as it is emitted (before it is kept).
    on_event: Callable[[str, dict[str, Any]], None] | None = None

    def node(
        self, node_id: str, start: int, end: int, tps: float = 100.0, sessions: int = 0
    ) -> Node:
        """A node of the network; ``sessions``: what its last heartbeat reported (a node
        honestly full reports some)."""
        now = timezone.now()
        return Node.objects.create(
            id=node_id,
            wallet="ab" * 32,
            endpoint=f"http://{node_id}.test:7000",
            model=self.model,
            shard_start=start,
            shard_end=end,
            hardware="cpu",
            benchmark_tps=tps,
            active_sessions=sessions,
            token_hash="0" * 64,
            registered_at=now,
            last_heartbeat_at=now,
        )

    def proxy(self, *, settings: dict[str, Any] | None = None, **body: Any) -> CompletionProxy:
        """A chat request's proxy (``/v1/chat/completions``); ``settings`` override the
        deployment's (:class:`~tracker_app.completions.proxy_terms.ProxySettings`)."""
        params = chat_params_parse(
            json.dumps(
                {
                    "model": self.model.key,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 12,
                    "temperature": 0,
                    "stream": True,
                    **body,
                }
            ).encode()
        )
        return self._proxy(params, ChatAnswer, settings or {})

    def text_proxy(self, **body: Any) -> CompletionProxy:
        """A legacy text completion's proxy (``/v1/completions``)."""
        params = text_completion_params_parse(
            json.dumps({"model": self.model.key, "prompt": "hi", "stream": True, **body}).encode()
        )
        return self._proxy(params, TextCompletionAnswer, {})

    def _proxy(
        self, params: GenerationParams, answer: AnswerKind, settings: dict[str, Any]
    ) -> CompletionProxy:
        async def emit(kind: str, request_id: str, **data: Any) -> None:
            if self.on_event is not None:
                self.on_event(kind, data)
            self.events.append((kind, data))

        request = CompletionRequest(
            params=params,
            api_key=api_key_create(name="client").api_key,
            model=self.model,
            answer=answer,
        )
        return CompletionProxy(
            request,
            client=httpx.AsyncClient(transport=httpx.MockTransport(self.heads)),
            settings=ProxySettings.from_settings(**({"progress_interval": 0.5} | settings)),
            emit=emit,
        )

    def banned(self) -> set[str]:
        return set(self.store.exclusions.banned_nodes())

    def event_kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]

    def event_data(self, kind: str) -> dict[str, Any]:
        """The data of the last event of ``kind``."""
        return [data for seen, data in self.events if seen == kind][-1]

    def route_signature(self) -> str:
        """The route the request was last sent to."""
        return str(self.event_data(console.ROUTE_SELECTED)["signature"])

    def progress_counts(self) -> list[int]:
        """The token counts the Call wall was shown, in order."""
        return [data["tokens"] for kind, data in self.events if kind == console.PROGRESS]


def fake_network() -> Iterator[Net]:
    """A fresh model with no nodes, its own route stats store and no bans (the ``net``
    fixture of the proxy's tests)."""
    model = LanguageModel.objects.create(
        key=f"proxy-test-{next(_models)}",
        display_name="proxy test model",
        num_layers=4,
        weight_source="builtin:test",
        prompt_price_per_1k=Decimal("0.010000"),
        completion_price_per_1k=Decimal("0.030000"),
    )
    TopologyEpoch.objects.create(model=model, number=1)
    store = RouteStatsStore(half_life=600.0, min_sample_tokens=8)
    BUSY_CLAIMS.reset()
    with process_store(store), pytest.MonkeyPatch.context() as patch:
        # A back-off count of its own: no failure another test counted bans a node here.
        patch.setattr(bans, "_bans", NodeBans())
        yield Net(model=model, store=store, heads=FakeHeads(), events=[])
    BUSY_CLAIMS.reset()


def chunk_of(event: bytes) -> dict[str, Any]:
    """The JSON of one server-sent event the proxy yields (one ``data:`` line)."""
    payload = sse_data(event.decode().strip())
    assert isinstance(payload, dict), event
    return payload


def served(proxy: CompletionProxy) -> tuple[list[dict[str, Any]], CompletionResult]:
    """The client's chunks, as the consumer would relay them, and how the request ended."""

    async def run() -> tuple[list[dict[str, Any]], CompletionResult]:
        chunks: list[dict[str, Any]] = []

        async def send(event: bytes) -> None:
            chunks.append(chunk_of(event))

        await proxy.start()
        result = await proxy.run(send)
        return chunks, result

    return asyncio.run(run())


def serve(proxy: CompletionProxy) -> list[dict[str, Any]]:
    """The client's chunks, as the consumer would relay them."""
    return served(proxy)[0]


async def relay(proxy: CompletionProxy, chunks: list[dict[str, Any]]) -> None:
    """Run the request, its chunks into ``chunks`` as they are sent."""

    async def send(event: bytes) -> None:
        chunks.append(chunk_of(event))

    await proxy.run(send)


async def relay_until(
    proxy: CompletionProxy, chunks: list[dict[str, Any]], done: Callable[[], bool]
) -> None:
    """Relay the request until ``done()``, then leave as a client does: the consumer
    cancels the relay, then fails the request."""
    task = asyncio.create_task(relay(proxy, chunks))
    for _ in range(500):
        if done():
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await proxy.fail("client disconnected", cancelled=True)


def serve_until_first_token_then_disconnect(proxy: CompletionProxy) -> list[dict[str, Any]]:
    """What the consumer does when its client goes away mid-stream: cancel, then fail."""

    async def run() -> list[dict[str, Any]]:
        await proxy.start()
        chunks: list[dict[str, Any]] = []
        await relay_until(proxy, chunks, lambda: bool(text(chunks)))
        return chunks

    return asyncio.run(run())


def text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if "choices" in c)


def record(proxy: CompletionProxy) -> ChatRequest:
    """The request's record."""
    return ChatRequest.objects.get(pk=proxy.request_id)


def work(proxy: CompletionProxy) -> list[tuple[str, int, int, int]]:
    """The work units the request was billed for: node, layers, tokens."""
    return [
        (unit.node_id, unit.start_layer, unit.end_layer, unit.tokens)
        for unit in WorkUnit.objects.filter(
            billing__request_id=uuid.UUID(proxy.request_id)
        ).order_by("id")
    ]


def texts_by_choice(chunks: list[dict[str, Any]]) -> dict[int, str]:
    """Each choice's text, joined from the chunks tagged with its index."""
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            texts[choice["index"]] = texts.get(choice["index"], "") + (
                choice["delta"].get("content") or ""
            )
    return texts
