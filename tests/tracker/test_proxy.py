"""ChatProxy against a fake head: what the client streams, what is recorded, billed and banned.

The head is faked at the HTTP boundary (``httpx.MockTransport``) and speaks
the real protocol: it parses the tracker's ``GenerateRequest`` and answers
with the protocol's frames. Routing, quarantine, accounting and billing are
the real ones, over the test database.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import OperationalError, ProgrammingError
from django.utils import timezone

from meshnet_site.database import OUTAGE_RETRY_PAUSES
from meshnet_site.errors import DomainError, http_error
from nodes_app.models import LanguageModel, Node, TopologyEpoch
from nodes_app.plans import tracker_public_key
from nodes_app.prompting import prompt_token_ids
from nodes_app.protocol.frames import ChunkFrame, ErrorFrame
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.sse import SSE_DONE, sse_data, sse_event
from nodes_app.protocol.usage import Usage
from nodes_app.signing import public_key_from_hex, verify_plan
from nodes_app.tokenization import tiny_tokenizer
from routing_app.bans import node_bans_reset
from routing_app.load import route_load
from routing_app.stats import RouteStatsStore
from routing_app.tracker_store import route_stats_store_install
from tests.support.database_errors import connection_cut
from tracker_app.api_keys.services import api_key_create
from tracker_app.completions import console
from tracker_app.completions import recording as accounting
from tracker_app.completions.chat import ChatAnswer, chat_params_parse
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.proxy import ChatProxy
from tracker_app.completions.slots import BUSY_RETRY_AFTER_SECONDS
from tracker_app.completions.text import TextCompletionAnswer, text_completion_params_parse
from tracker_app.models import BillingRecord, ChatRequest, RequestStatus, WorkUnit

pytestmark = pytest.mark.django_db(transaction=True)

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
        if not self.events[-1].startswith(sse_event(SSE_DONE)):
            await asyncio.Event().wait()  # a head still generating, as long as it takes

    async def aclose(self) -> None:
        self.closed.append(self.node)


@dataclass
class Behaviour:
    """What a fake head does with one request (the default: answer it all)."""

    status: int = 200
    tokens: int | None = None  # stop after this many new tokens…
    then: str = "done"  # …and then: "die", "blame:<node>", "busy", "garbage", "hang"
    connect_error: bool = False
    body: dict[str, Any] | None = None
    message: str = "failed"  # an error frame's message
    gap: float = 0.0  # seconds between two frames


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
                        content=token_text(position),
                        token_ids=(token_id(position),),
                        finish_reason="length" if done else None,
                        usage=Usage(PROMPT_TOKENS, position + 1) if done else None,
                    )
                )
            )
        if behaviour.then.startswith("blame:"):
            blamed = behaviour.then.removeprefix("blame:")
            frame = ErrorFrame(f"hop {blamed} {behaviour.message}", node_id=blamed)
            events.append(sse_event(frame.to_json()))
        elif behaviour.then == "busy":
            events.append(sse_event(ErrorFrame("full", code="hop_busy", node_id="x").to_json()))
        elif behaviour.then == "garbage":
            events.append(b"data: {not json\n\n")
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

    def node(self, node_id: str, start: int, end: int, tps: float = 100.0) -> Node:
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
            token_hash="0" * 64,
            registered_at=now,
            last_heartbeat_at=now,
        )

    def proxy(self, *, progress_interval: float = 0.5, **body: Any) -> ChatProxy:
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

        return self._proxy(params, ChatAnswer, progress_interval)

    def text_proxy(self, **body: Any) -> ChatProxy:
        """A legacy text completion's proxy (``/v1/completions``)."""
        params = text_completion_params_parse(
            json.dumps({"model": self.model.key, "prompt": "hi", "stream": True, **body}).encode()
        )
        return self._proxy(params, TextCompletionAnswer, 0.5)

    def _proxy(self, params: GenerationParams, answer: Any, progress_interval: float) -> ChatProxy:
        async def emit(kind: str, request_id: str, **data: Any) -> None:
            self.events.append((kind, data))

        return ChatProxy(
            params=params,
            answer=answer,
            api_key=api_key_create(name="client").api_key,
            model=self.model,
            client=httpx.AsyncClient(transport=httpx.MockTransport(self.heads)),
            fee_share=Decimal("0.05"),
            emit=emit,
            progress_interval=progress_interval,
        )

    def banned(self) -> set[str]:
        return set(self.store.exclusions.banned_nodes())

    def event_kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]

    def event_data(self, kind: str) -> dict[str, Any]:
        """The data of the last event of ``kind``."""
        return [data for seen, data in self.events if seen == kind][-1]

    def progress_counts(self) -> list[int]:
        """The token counts the Call wall was shown, in order."""
        return [data["tokens"] for kind, data in self.events if kind == console.PROGRESS]


@pytest.fixture
def net() -> Iterator[Net]:
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
    previous = route_stats_store_install(store)
    node_bans_reset()
    yield Net(model=model, store=store, heads=FakeHeads(), events=[])
    route_stats_store_install(previous)
    node_bans_reset()


def chunk_of(event: bytes) -> dict[str, Any]:
    """The JSON of one server-sent event the proxy yields (one ``data:`` line)."""
    payload = sse_data(event.decode().strip())
    assert isinstance(payload, dict), event
    return payload


def serve(proxy: ChatProxy) -> list[dict[str, Any]]:
    """The client's chunks, as the consumer would relay them."""

    async def run() -> list[dict[str, Any]]:
        await proxy.start()
        chunks = [chunk_of(event) async for event in proxy.run()]
        await proxy.client.aclose()
        return chunks

    return asyncio.run(run())


def serve_until_first_token_then_disconnect(proxy: ChatProxy) -> list[dict[str, Any]]:
    """What the consumer does when its client goes away mid-stream: cancel, then fail."""

    async def run() -> list[dict[str, Any]]:
        await proxy.start()
        chunks: list[dict[str, Any]] = []

        async def relay() -> None:
            async for event in proxy.run():
                chunks.append(chunk_of(event))

        task = asyncio.create_task(relay())
        while not text(chunks):
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await proxy.fail("client disconnected", cancelled=True)
        await proxy.client.aclose()
        return chunks

    return asyncio.run(run())


def text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if "choices" in c)


def record(proxy: ChatProxy) -> ChatRequest:
    return ChatRequest.objects.get(pk=proxy.request_uuid)


def work(proxy: ChatProxy) -> list[tuple[str, int, int, int]]:
    return [
        (unit.node_id, unit.start_layer, unit.end_layer, unit.tokens)
        for unit in WorkUnit.objects.filter(billing__request_id=proxy.request_uuid).order_by("id")
    ]


# --- the tests ----------------------------------------------------------------


def test_a_completed_request_streams_every_token_then_usage_and_bills_each_hop(
    net: Net,
) -> None:
    net.node("head", 0, 1)
    net.node("tail", 2, 3)
    proxy = net.proxy()

    chunks = serve(proxy)

    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["meshnet"]["route"] == f"{net.model.key} | head[0-1] -> tail[2-3]"
    assert text(chunks) == answer(12)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 12, "total_tokens": 19}
    assert all("meshnet_token_ids" not in chunk for chunk in chunks)
    request = record(proxy)
    assert (request.status, request.completion_tokens) == (RequestStatus.COMPLETED, 12)
    bill = BillingRecord.objects.get(request=request)
    # 7 prompt tokens at 0.01/1k and 12 completion tokens at 0.03/1k.
    assert bill.charge == Decimal("0.000070") + Decimal("0.000360")
    assert work(proxy) == [("head", 0, 1, 19), ("tail", 2, 3, 19)]
    kinds = net.event_kinds()
    assert kinds[:2] == [console.ROUTE_SELECTED, console.CONNECTED]
    # Progress is pushed off the relay: a head this fast finishes before any is due.
    assert set(kinds[2:-1]) <= {console.PROGRESS} and kinds[-1] == console.COMPLETE
    assert net.event_data(console.COMPLETE)["completion_tokens"] == 12
    assert net.heads.requests[0].resume_token_ids == []


def test_a_full_head_is_waited_for_and_nobody_is_banned(net: Net) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(status=503), Behaviour(tokens=0, then="busy"), Behaviour())
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.heads.heads_asked() == ["whole", "whole", "whole"]
    assert record(proxy).status == RequestStatus.COMPLETED
    assert net.banned() == set()


def test_a_head_that_dies_mid_stream_is_banned_and_another_route_resumes_without_gap(
    net: Net,
) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=5, then="die"))
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert net.heads.heads_asked() == ["fast", "slow"]
    assert net.heads.requests[1].resume_token_ids == [token_id(i) for i in range(5)]
    assert net.banned() == {"fast"}
    request = record(proxy)
    assert request.status == RequestStatus.COMPLETED
    assert "slow" in request.route_signature
    # Both routes ran their layers over the prompt and the tokens they saw.
    assert work(proxy) == [("fast", 0, 3, 7 + 5), ("slow", 0, 3, 7 + 5 + 7)]
    assert net.event_kinds().count(console.ROUTE_SELECTED) == 2


@pytest.mark.parametrize(
    ("blamed", "banned"),
    [("tail", "tail"), ("someone-else", "head")],
    ids=["a-hop-of-the-route", "a-node-outside-the-route-so-the-head"],
)
def test_an_error_frame_bans_the_hop_it_blames_if_that_hop_is_on_the_route(
    net: Net, blamed: str, banned: str
) -> None:
    net.node("head", 0, 1, tps=300)
    net.node("tail", 2, 3, tps=300)
    net.node("whole", 0, 3, tps=50)
    net.heads.plan("head", Behaviour(tokens=3, then=f"blame:{blamed}"), Behaviour())
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.banned() == {banned}
    assert net.heads.requests[1].resume_token_ids == [token_id(i) for i in range(3)]
    assert record(proxy).status == RequestStatus.COMPLETED


def test_a_malformed_frame_is_the_heads_failure(net: Net) -> None:
    net.node("garbled", 0, 3, tps=300)
    net.node("sound", 0, 3, tps=100)
    net.heads.plan("garbled", Behaviour(tokens=2, then="garbage"))
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.banned() == {"garbled"}
    assert net.heads.heads_asked() == ["garbled", "sound"]


def test_a_cancelled_request_is_recorded_cancelled_not_charged_and_the_head_is_let_go(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(tokens=1, then="hang"))
    proxy = net.proxy()

    chunks = serve_until_first_token_then_disconnect(proxy)

    assert text(chunks) == token_text(0)
    request = record(proxy)
    assert (request.status, request.error) == (RequestStatus.CANCELLED, "client disconnected")
    assert not BillingRecord.objects.filter(request=request).exists()
    assert net.heads.closed == ["whole"]
    assert net.event_kinds()[-1] == console.ERROR
    assert net.banned() == set()


def test_when_failovers_run_out_the_stream_ends_with_an_error_and_nothing_is_charged(
    net: Net,
) -> None:
    for i, node_id in enumerate(["a", "b", "c", "d", "e"]):
        net.node(node_id, 0, 3, tps=500 - 100 * i)
        net.heads.plan(node_id, Behaviour(connect_error=True))
    proxy = net.proxy()

    chunks = serve(proxy)

    error = chunks[-1]["error"]
    assert (error["code"], error["type"]) == ("upstream_failed", "upstream_error")
    assert "too many failovers" in error["message"]
    assert net.heads.heads_asked() == ["a", "b", "c", "d"]
    assert net.banned() == {"a", "b", "c", "d"}
    request = record(proxy)
    assert request.status == RequestStatus.FAILED
    assert not BillingRecord.objects.filter(request=request).exists()


def test_a_pinned_route_never_fails_over(net: Net) -> None:
    net.node("pinned", 0, 3, tps=100)
    net.node("other", 0, 3, tps=300)
    net.heads.plan("pinned", Behaviour(tokens=2, then="die"))
    proxy = net.proxy(route=["pinned"])

    chunks = serve(proxy)

    assert text(chunks) == answer(2)
    assert chunks[-1]["error"]["code"] == "upstream_failed"
    assert "pinned route" in chunks[-1]["error"]["message"]
    assert net.heads.heads_asked() == ["pinned"]
    assert record(proxy).status == RequestStatus.FAILED


def test_a_head_that_refuses_the_request_passes_its_code_on_not_its_text_and_bans_nobody(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    refusal = {"error": {"message": "too long", "type": "x", "code": "context_length_exceeded"}}
    net.heads.plan("whole", Behaviour(status=400, body=refusal))
    proxy = net.proxy()

    chunks = serve(proxy)

    error = chunks[-1]["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert "whole" in error["message"] and "too long" not in error["message"]
    assert isinstance(proxy.error, DomainError)
    assert http_error(proxy.error).status == 400
    assert net.banned() == set()
    assert record(proxy).status == RequestStatus.FAILED


def test_a_head_that_refuses_a_prompt_the_tracker_counted_is_banned_and_failed_over(
    net: Net,
) -> None:
    net.model.weight_source = "builtin:tiny-random-llama"  # a tokenizer the tracker loads
    net.node("liar", 0, 3, tps=1e12)
    net.node("honest", 0, 3)
    refusal = {"error": {"message": "too long", "type": "x", "code": "context_length_exceeded"}}
    net.heads.plan("liar", Behaviour(status=400, body=refusal))
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.heads.heads_asked() == ["liar", "honest"]
    assert net.banned() == {"liar"}
    assert record(proxy).status == RequestStatus.COMPLETED


@pytest.mark.parametrize(
    ("status", "code", "kind_status"),
    [(413, "request_too_large", 413), (400, "prompt_too_long", 400)],
)
def test_a_head_refusing_a_counted_prompt_past_its_own_size_caps_bans_nobody(
    net: Net, status: int, code: str, kind_status: int
) -> None:
    # The head's --max-request-bytes / --max-prompt-chars are caps the tracker
    # cannot know: even for a prompt it counted, such a refusal is the client's.
    net.model.weight_source = "builtin:tiny-random-llama"  # a tokenizer the tracker loads
    net.node("small", 0, 3)
    refusal = {"error": {"message": "too big", "type": "x", "code": code}}
    net.heads.plan("small", Behaviour(status=status, body=refusal))
    proxy = net.proxy()

    chunks = serve(proxy)

    assert chunks[-1]["error"]["code"] == code
    assert "too big" not in chunks[-1]["error"]["message"]
    assert isinstance(proxy.error, DomainError)
    assert http_error(proxy.error).status == kind_status
    assert net.banned() == set()
    assert record(proxy).status == RequestStatus.FAILED


def test_a_head_refusing_sampling_the_tracker_checked_is_banned_even_for_an_uncounted_prompt(
    net: Net,
) -> None:
    # The tracker checks sampling with the nodes' own rule before it sends anything.
    net.node("liar", 0, 3, tps=1e12)
    net.node("honest", 0, 3)
    refusal = {"error": {"message": "no", "type": "x", "code": "bad_sampling"}}
    net.heads.plan("liar", Behaviour(status=400, body=refusal))
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.heads.heads_asked() == ["liar", "honest"]
    assert net.banned() == {"liar"}


def test_a_head_refusing_a_logit_bias_is_the_clients_400_as_only_nodes_know_the_vocabulary(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    refusal = {"error": {"message": "no", "type": "x", "code": "bad_sampling"}}
    net.heads.plan("whole", Behaviour(status=400, body=refusal))
    proxy = net.proxy(logit_bias={"999999": 3})

    chunks = serve(proxy)

    error = chunks[-1]["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "bad_sampling",
        "logit_bias",
        "invalid_request_error",
    )
    assert net.heads.heads_asked() == ["whole"]
    assert net.banned() == set()
    assert net.heads.requests[0].sampling.logit_bias == ((999999, 3.0),)


def test_usage_a_head_inflates_is_logged_and_billed_at_the_trackers_count(
    net: Net, caplog: pytest.LogCaptureFixture
) -> None:
    net.model.weight_source = "builtin:tiny-random-llama"
    net.node("whole", 0, 3)
    proxy = net.proxy()
    counted = len(prompt_token_ids(tiny_tokenizer(), [{"role": "user", "content": "hi"}]))
    assert counted != PROMPT_TOKENS  # the fake head always reports 7

    chunks = serve(proxy)

    assert chunks[-1]["usage"]["prompt_tokens"] == counted
    assert record(proxy).prompt_tokens == counted
    assert work(proxy) == [("whole", 0, 3, counted + 12)]
    (line,) = [r.getMessage() for r in caplog.records if "reported" in r.getMessage()]
    assert f"head whole reported {PROMPT_TOKENS} prompt" in line
    assert f"counted {counted} prompt" in line and proxy.request_id in line


def test_a_prompt_past_the_context_is_refused_before_any_route_is_chosen(net: Net) -> None:
    net.model.weight_source = "builtin:tiny-random-llama"  # 4096 positions
    net.node("whole", 0, 3)
    proxy = net.proxy(messages=[{"role": "user", "content": "x" * 4000}], max_tokens=200)

    with pytest.raises(DomainError) as refused:
        asyncio.run(proxy.start())

    assert refused.value.code == "context_length_exceeded"
    assert http_error(refused.value).status == 400
    assert net.heads.requests == [] and not ChatRequest.objects.exists()


MARKER = "SECRET-UPSTREAM-MARKER http://169.254.169.254/latest"


@pytest.mark.parametrize(
    "behaviour",
    [
        Behaviour(tokens=2, then="blame:whole", message=MARKER),
        Behaviour(status=500, body={"error": {"message": MARKER, "code": MARKER}}),
        Behaviour(status=400, body={"error": {"message": MARKER, "code": "Not A Code!"}}),
    ],
    ids=["error-frame", "http-500-body", "http-400-body"],
)
def test_a_nodes_own_words_never_reach_the_client(net: Net, behaviour: Behaviour) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", behaviour)
    proxy = net.proxy(route=["whole"])

    chunks = serve(proxy)

    error = chunks[-1]["error"]
    assert "whole" in error["message"]
    assert MARKER not in json.dumps(chunks)
    assert MARKER not in (record(proxy).error or "")
    assert "169.254" not in json.dumps(net.events)


def test_every_send_to_a_head_carries_a_fresh_plan_signed_by_the_tracker(net: Net) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=5, then="die"))
    began = time.time()

    serve(net.proxy())

    key = public_key_from_hex(tracker_public_key())
    first, second = net.heads.requests
    for request in (first, second):
        assert verify_plan(key, request.plan.signed_fields(), request.signature)
        assert began < request.expires_at <= time.time() + settings.MESHNET_PLAN_VALIDITY + 1
    assert first.signature != second.signature
    assert [r.hops[0].node_id for r in (first, second)] == ["fast", "slow"]


def wait_in_frozen_time(proxy: ChatProxy, *, busy_deadline: float) -> list[float]:
    """Time passes for ``proxy`` only while it waits; returns the list its waits go to."""
    now = [1000.0]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    proxy.clock, proxy.sleep, proxy.busy_deadline = (lambda: now[0]), sleep, busy_deadline
    return waits


def test_a_route_busy_past_the_busy_deadline_is_a_503_with_retry_after_and_bans_nobody(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(status=503))
    proxy = net.proxy()
    waits = wait_in_frozen_time(proxy, busy_deadline=10.0)

    chunks = serve(proxy)

    assert chunks[-1]["error"]["code"] == "route_busy"
    answer = http_error(proxy.error)  # type: ignore[arg-type]
    assert (answer.status, answer.headers) == (503, {"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)})
    # Capped exponential back-off: each wait in the upper half of 50 ms, 100 ms, … 1 s, 1 s…,
    # the last one cut to end exactly at the deadline; one more look, then the 503.
    steps = [min(1.0, 0.05 * 2**attempt) for attempt in range(len(waits))]
    assert all(step / 2 <= wait <= step for wait, step in zip(waits[:-1], steps, strict=False))
    assert sum(waits) == pytest.approx(10.0) and len(waits) > 10
    assert len(net.heads.requests) == len(waits) + 1
    assert net.banned() == set()
    assert record(proxy).status == RequestStatus.FAILED


def test_a_hop_busy_behind_a_head_that_accepted_still_backs_off_to_the_deadline(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(tokens=0, then="busy"))  # 200, then hop_busy
    proxy = net.proxy()
    waits = wait_in_frozen_time(proxy, busy_deadline=10.0)

    chunks = serve(proxy)

    assert chunks[-1]["error"]["code"] == "route_busy"
    # The head's 200 is not a slot: the back-off grows as when the head itself is full.
    steps = [min(1.0, 0.05 * 2**attempt) for attempt in range(len(waits))]
    assert all(step / 2 <= wait <= step for wait, step in zip(waits[:-1], steps, strict=False))
    assert sum(waits) == pytest.approx(10.0) and len(waits) < 20
    assert net.banned() == set()


def test_the_busy_deadline_counts_every_wait_of_a_request_not_each_wait_afresh(net: Net) -> None:
    net.node("first", 0, 3, tps=200.0)
    net.node("second", 0, 3, tps=100.0)
    net.heads.plan("first", *[Behaviour(status=503)] * 3, Behaviour(tokens=2, then="die"))
    net.heads.plan("second", Behaviour(status=503))
    proxy = net.proxy()
    waits = wait_in_frozen_time(proxy, busy_deadline=10.0)

    chunks = serve(proxy)

    assert text(chunks) == answer(2)
    assert chunks[-1]["error"]["code"] == "route_busy"
    # Three waits for the first head, then on the second route only what was left.
    assert sum(waits) == pytest.approx(10.0)
    assert net.heads.heads_asked()[:5] == ["first"] * 4 + ["second"]
    assert net.banned() == {"first"}


def test_with_no_route_the_request_is_refused_before_anything_is_streamed(net: Net) -> None:
    net.node("head-only", 0, 1)
    proxy = net.proxy()

    with pytest.raises(DomainError) as refused:
        asyncio.run(proxy.start())

    assert refused.value.code == "no_route"
    assert http_error(refused.value).status == 503
    assert not ChatRequest.objects.exists()


def test_progress_reaches_the_dashboard_while_tokens_stream_throttled_and_the_final_count_is_exact(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(gap=0.02))  # 12 tokens over ~0.25 s
    proxy = net.proxy(progress_interval=0.06)

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    counts = net.progress_counts()
    assert len(counts) >= 2, counts  # the dashboard saw the request move…
    assert len(counts) < 12, counts  # …not once per token
    assert counts == sorted(counts) and counts[-1] <= 12
    kinds = net.event_kinds()
    assert kinds[-1] == console.COMPLETE  # nothing after the final state
    assert net.event_data(console.COMPLETE)["completion_tokens"] == 12


def test_a_burst_of_tokens_before_a_pause_reaches_the_dashboard_at_the_end_of_the_interval(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    # Five tokens ~10 ms apart, then the head goes quiet (a long step, say).
    net.heads.plan("whole", Behaviour(tokens=5, then="hang", gap=0.01))
    proxy = net.proxy(progress_interval=0.5)

    async def run() -> None:
        await proxy.start()
        relay = asyncio.create_task(consume(proxy))
        for _ in range(100):
            if 5 in net.progress_counts():
                break
            await asyncio.sleep(0.05)
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        await proxy.fail("client disconnected", cancelled=True)
        await proxy.client.aclose()

    asyncio.run(run())

    counts = net.progress_counts()
    # The first token at once, the rest of the burst when the interval ended: no
    # further token came to carry it, and none was sent per token.
    assert counts[-1] == 5 and len(counts) <= 2, counts
    assert net.event_kinds()[-1] == console.ERROR


def test_a_request_that_fails_between_two_progress_events_shows_its_last_count(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(tokens=4, then="hang", gap=0.01))
    proxy = net.proxy(progress_interval=60.0)  # only the first token's event is due

    async def run() -> None:
        await proxy.start()
        relay = asyncio.create_task(consume(proxy))
        while proxy.completion_tokens < 4:
            await asyncio.sleep(0.01)
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        await proxy.fail("client disconnected", cancelled=True)
        await proxy.client.aclose()

    asyncio.run(run())

    assert net.progress_counts()[-1] == 4
    assert net.event_kinds()[-2:] == [console.PROGRESS, console.ERROR]


async def consume(proxy: ChatProxy) -> None:
    async for _ in proxy.run():
        pass


# --- n choices ----------------------------------------------------------------


def texts_by_choice(chunks: list[dict[str, Any]]) -> dict[int, str]:
    """Each choice's text, joined from the chunks tagged with its index."""
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            texts[choice["index"]] = texts.get(choice["index"], "") + (
                choice["delta"].get("content") or ""
            )
    return texts


def test_n_choices_stream_tagged_by_index_with_usage_summed_and_the_prompt_billed_once(
    net: Net,
) -> None:
    net.node("head", 0, 1)
    net.node("tail", 2, 3)
    proxy = net.proxy(n=3, seed=40, temperature=0.8)

    chunks = serve(proxy)

    assert texts_by_choice(chunks) == {0: answer(12), 1: answer(12), 2: answer(12)}
    openings = [c["choices"][0] for c in chunks if "role" in c["choices"][0]["delta"]]
    assert [o["index"] for o in openings] == [0, 1, 2]
    assert "meshnet" in chunks[0] and all("meshnet" not in c for c in chunks[1:])
    finishes = [c for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(c["choices"][0]["index"] for c in finishes) == [0, 1, 2]
    assert finishes[-1] is chunks[-1] and all("usage" not in c for c in finishes[:-1])
    assert chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 36, "total_tokens": 43}
    # One route, three generations on it, each its own seed.
    assert net.heads.heads_asked() == ["head"] * 3
    assert sorted(r.sampling.seed or 0 for r in net.heads.requests) == [40, 41, 42]
    bill = BillingRecord.objects.get(request=record(proxy))
    # The prompt once (7 at 0.01/1k), every choice's tokens (36 at 0.03/1k).
    assert bill.charge == Decimal("0.000070") + Decimal("0.001080")
    # Each hop ran its layers over the prompt and the tokens of every choice.
    assert work(proxy) == [("head", 0, 1, 3 * 19), ("tail", 2, 3, 3 * 19)]
    shares = sum((u.amount for u in WorkUnit.objects.filter(billing=bill)), Decimal(0))
    assert shares == bill.charge - bill.network_fee
    assert record(proxy).completion_tokens == 36
    assert net.event_data(console.COMPLETE)["completion_tokens"] == 36


def test_a_requests_own_choices_are_not_its_queue_on_the_dashboard(net: Net) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(gap=0.02))
    proxy = net.proxy(n=3, progress_interval=0.05)

    chunks = serve(proxy)

    assert texts_by_choice(chunks) == {0: answer(12), 1: answer(12), 2: answer(12)}
    queues = [data["queue"] for kind, data in net.events if kind == console.PROGRESS]
    assert queues and set(queues) == {0}, queues


def test_a_choice_whose_head_dies_fails_over_alone_while_the_others_go_on(net: Net) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=5, then="die"), Behaviour())
    proxy = net.proxy(n=2)

    chunks = serve(proxy)

    assert texts_by_choice(chunks) == {0: answer(12), 1: answer(12)}
    assert net.heads.heads_asked() == ["fast", "fast", "slow"]
    assert net.heads.requests[2].resume_token_ids == [token_id(i) for i in range(5)]
    assert net.banned() == {"fast"}
    assert chunks[-1]["usage"]["completion_tokens"] == 24
    # fast: one whole choice (7 + 12) and five tokens of the other (7 + 5);
    # slow: that choice's prompt and five replayed tokens, then its last seven.
    assert work(proxy) == [("fast", 0, 3, 19 + 12), ("slow", 0, 3, 7 + 5 + 7)]
    assert record(proxy).status == RequestStatus.COMPLETED


def test_a_node_that_dies_under_every_choice_is_banned_once_not_once_per_choice(
    net: Net, caplog: pytest.LogCaptureFixture
) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=5, then="die", gap=0.01))
    proxy = net.proxy(n=4)

    with caplog.at_level(logging.INFO, logger="tracker_app.completions.proxy"):
        chunks = serve(proxy)

    assert texts_by_choice(chunks) == {i: answer(12) for i in range(4)}
    assert net.heads.heads_asked() == ["fast"] * 4 + ["slow"] * 4
    bans = [r.getMessage() for r in caplog.records if "banned for" in r.getMessage()]
    assert len(bans) == 1 and bans[0].endswith("banned for 30 s"), bans  # the first step
    assert net.banned() == {"fast"}


def test_a_choice_that_cannot_fail_over_fails_the_request_and_lets_the_other_heads_go(
    net: Net,
) -> None:
    whole = net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(tokens=2, then="hang"), Behaviour(tokens=1, then="die"))
    proxy = net.proxy(n=2, route=[whole.id])

    chunks = serve(proxy)

    assert chunks[-1]["error"]["code"] == "upstream_failed"
    request = record(proxy)
    assert request.status == RequestStatus.FAILED
    assert not BillingRecord.objects.filter(request=request).exists()
    # The hanging choice's stream was closed too: its head frees its sessions.
    assert net.heads.closed == ["whole", "whole"]


def test_every_streaming_choice_is_load_on_its_route_until_the_request_ends(net: Net) -> None:
    # The thompson-load policy weighs a route by the streams it carries: the
    # choice that waited for a slot counts again once it streams, and none
    # outlives the request.
    net.node("whole", 0, 3)
    paced = Behaviour(gap=0.02)
    net.heads.plan("whole", Behaviour(status=503), paced, paced)
    proxy = net.proxy(n=2, progress_interval=0.0)
    relayed = proxy.emit
    load_seen: list[int] = []

    async def emit(kind: str, request_id: str, **data: Any) -> None:
        if kind == console.PROGRESS:
            load_seen.append(route_load().snapshot().routes.get(proxy.meshnet["route"], 0))
        await relayed(kind, request_id, **data)

    proxy.emit = emit

    chunks = serve(proxy)

    assert texts_by_choice(chunks) == {0: answer(12), 1: answer(12)}
    assert net.heads.heads_asked() == ["whole"] * 3
    assert max(load_seen) == 2
    assert route_load().snapshot().routes.get(proxy.meshnet["route"], 0) == 0


def test_a_request_whose_client_left_before_its_stream_began_is_no_load(net: Net) -> None:
    # The consumer fails a request whose client went away while its headers were being
    # sent; run() never began, so only fail() can take it off its route.
    net.node("whole", 0, 3)
    proxy = net.proxy()

    async def start_then_disconnect() -> tuple[int, int]:
        await proxy.start()
        chosen = route_load().snapshot().routes.get(proxy.meshnet["route"], 0)
        await proxy.fail("client disconnected", cancelled=True)
        await proxy.client.aclose()
        return chosen, route_load().snapshot().routes.get(proxy.meshnet["route"], 0)

    assert asyncio.run(start_then_disconnect()) == (1, 0)
    assert record(proxy).status == RequestStatus.CANCELLED


def test_a_streaming_choice_shows_its_route_the_tokens_it_has_relayed(net: Net) -> None:
    # thompson-load reads a stream's pace (tokens on the route / time since it was sent
    # there) as an early sample: the book must hold what the client has been sent.
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(gap=0.02))
    proxy = net.proxy(progress_interval=0.0)
    relayed = proxy.emit
    seen: list[tuple[list[int], int]] = []  # (tokens the book shows, tokens relayed)

    async def emit(kind: str, request_id: str, **data: Any) -> None:
        if kind == console.PROGRESS:
            paces = route_load().snapshot().paces.get(proxy.meshnet["route"], ())
            seen.append(([pace.tokens for pace in paces], proxy.completion_tokens))
        await relayed(kind, request_id, **data)

    proxy.emit = emit

    chunks = serve(proxy)

    assert texts_by_choice(chunks) == {0: answer(12)}
    streaming = [(shown, sent) for shown, sent in seen if sent]
    assert len(streaming) >= 3
    assert all(shown == [sent] for shown, sent in streaming)


# --- echo ---------------------------------------------------------------------


def echo_asked(net: Net) -> list[bool]:
    """Whether each send asked its head to score the prompt."""
    return [request.echo for request in net.heads.requests]


def test_an_echo_already_relayed_is_not_scored_again_by_the_failover_route(net: Net) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=5, then="die"))
    proxy = net.text_proxy(echo=True, logprobs=1, max_tokens=12)

    chunks = serve(proxy)

    assert "".join(c["choices"][0]["text"] for c in chunks) == "hi" + answer(12)
    assert net.heads.heads_asked() == ["fast", "slow"]
    assert echo_asked(net) == [True, False]


def test_an_echo_without_logprobs_is_the_trackers_own_text_and_asks_no_scores(net: Net) -> None:
    net.node("whole", 0, 3)
    proxy = net.text_proxy(echo=True, max_tokens=3)

    chunks = serve(proxy)

    assert "".join(c["choices"][0]["text"] for c in chunks) == "hi" + answer(3)
    assert echo_asked(net) == [False]


def test_a_scoring_echo_resent_after_its_echo_still_asks_for_it_as_no_token_is_asked(
    net: Net,
) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=0, then="die"))
    proxy = net.text_proxy(echo=True, logprobs=1, max_tokens=0)

    serve(proxy)

    assert net.heads.heads_asked() == ["fast", "slow"]
    assert echo_asked(net) == [True, True]


def test_a_prompt_too_long_to_score_is_refused_only_when_its_scores_are_asked(net: Net) -> None:
    net.model.weight_source = "builtin:tiny-random-llama"  # 4096 positions
    net.node("whole", 0, 3)
    prompt = "x" * 3000  # 6 scores a token with 5 alternatives: past 2^14
    scoring = net.text_proxy(prompt=prompt, echo=True, logprobs=5, max_tokens=1)
    echoing = net.text_proxy(prompt=prompt, echo=True, max_tokens=1)

    with pytest.raises(DomainError) as refused:
        asyncio.run(scoring.start())
    asyncio.run(echoing.start())

    assert refused.value.code == "prompt_too_long"
    assert echoing.generations[0].prompt_count.tokens * 6 > 2**14


# --- the database going away as the answer ends -----------------------------------


@dataclass
class Blips:
    """Stands in for ``accounting.chat_request_complete``: the database is away for the
    first ``away`` tries; with ``lost_ack``, the first try's commit goes through and
    only its answer is lost; with ``then_bug``, the try after the outage fails as a
    bug of ours would."""

    away: int = 0
    lost_ack: bool = False
    then_bug: bool = False
    tries: int = 0
    real: Any = accounting.chat_request_complete

    def __call__(self, **kwargs: Any) -> Any:
        self.tries += 1
        if self.tries <= self.away:
            raise connection_cut()
        if self.then_bug:
            raise ProgrammingError("column does not exist")
        result = self.real(**kwargs)
        if self.lost_ack and self.tries == 1:
            raise connection_cut()
        return result


def bills(proxy: ChatProxy) -> int:
    return BillingRecord.objects.filter(request_id=proxy.request_uuid).count()


def proxy_through(
    net: Net, monkeypatch: pytest.MonkeyPatch, blips: Blips
) -> tuple[ChatProxy, list[float]]:
    """A proxy on one whole-model node whose completion meets ``blips``, and the pauses
    it takes between tries (recorded, not waited)."""
    net.node("whole", 0, 3)
    proxy, pauses = net.proxy(), []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    proxy.sleep = pause
    monkeypatch.setattr(accounting, "chat_request_complete", blips)
    return proxy, pauses


def test_a_database_blip_as_the_answer_ends_is_waited_out_and_the_request_billed(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    blips = Blips(away=2)
    proxy, pauses = proxy_through(net, monkeypatch, blips)

    chunks = serve(proxy)

    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert (record(proxy).status, bills(proxy)) == (RequestStatus.COMPLETED, 1)
    assert (blips.tries, pauses) == (3, list(OUTAGE_RETRY_PAUSES[:2]))
    assert net.event_kinds()[-1] == console.COMPLETE


def test_a_completion_whose_commit_went_through_before_the_cut_is_billed_once(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    blips = Blips(lost_ack=True)
    proxy, _ = proxy_through(net, monkeypatch, blips)

    chunks = serve(proxy)

    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert (record(proxy).status, bills(proxy), blips.tries) == (RequestStatus.COMPLETED, 1, 2)


def test_a_database_away_past_every_retry_leaves_the_request_open_for_the_sweep(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    blips = Blips(away=len(OUTAGE_RETRY_PAUSES) + 1)
    proxy, pauses = proxy_through(net, monkeypatch, blips)

    with pytest.raises(OperationalError):
        serve(proxy)

    assert (record(proxy).status, bills(proxy)) == (RequestStatus.PROCESSING, 0)
    assert (blips.tries, pauses) == (len(OUTAGE_RETRY_PAUSES) + 1, list(OUTAGE_RETRY_PAUSES))


def leave_while_billed(net: Net, proxy: ChatProxy, until: str) -> list[dict[str, Any]]:
    """The client leaves while the first try of its completion waits out an outage (the
    consumer cancels, then fails the request); then the proxy carries on alone until the
    console hears ``until``."""

    async def run() -> list[dict[str, Any]]:
        await proxy.start()
        paused, resume = asyncio.Event(), asyncio.Event()

        async def pause(seconds: float) -> None:  # the database is away: the client leaves
            paused.set()
            await resume.wait()

        proxy.sleep = pause
        chunks: list[dict[str, Any]] = []

        async def relay() -> None:
            async for event in proxy.run():
                chunks.append(chunk_of(event))

        task = asyncio.create_task(relay())
        await paused.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await proxy.fail("client disconnected", cancelled=True)  # as the consumer does
        resume.set()
        for _ in range(500):  # the completion ends alone: its console event is its last step
            if until in net.event_kinds():
                break
            await asyncio.sleep(0.01)
        await proxy.client.aclose()
        return chunks

    return asyncio.run(run())


def test_a_client_that_leaves_while_its_answer_is_billed_is_still_billed(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    net.node("whole", 0, 3)
    proxy = net.proxy()
    monkeypatch.setattr(accounting, "chat_request_complete", Blips(away=1))

    chunks = leave_while_billed(net, proxy, until=console.COMPLETE)

    assert text(chunks) == answer(12)
    assert "usage" not in chunks[-1]
    assert (record(proxy).status, bills(proxy)) == (RequestStatus.COMPLETED, 1)
    assert net.event_kinds()[-1] == console.COMPLETE
    assert console.ERROR not in net.event_kinds()


def test_a_completion_that_fails_after_its_client_left_records_the_request_failed(
    net: Net, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    net.node("whole", 0, 3)
    proxy = net.proxy()
    monkeypatch.setattr(accounting, "chat_request_complete", Blips(away=1, then_bug=True))

    with caplog.at_level(logging.ERROR, logger="tracker_app.completions.proxy"):
        leave_while_billed(net, proxy, until=console.ERROR)

    request = record(proxy)
    assert (request.status, request.error, bills(proxy)) == (
        RequestStatus.FAILED,
        "the tracker failed to serve this request",
        0,
    )
    assert net.event_kinds()[-1] == console.ERROR
    assert any(r.exc_info and r.exc_info[0] is ProgrammingError for r in caplog.records)
