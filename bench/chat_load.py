"""Many streamed chats at once through one tracker: what each client saw, and what it cost.

The load driver of ``bench/bench_load.py`` (the full 200) and
``bench/bench_concurrent_smollm2.py``; ``tests/tracker/test_concurrent_chats.py``
runs a reduced load through it in CI. :func:`expected_answers` sends each
distinct prompt once, alone, at temperature 0: the greedy answer any
concurrent copy must equal. :func:`run_load` then sends every chat at once (or
``concurrency`` at a time, for the baseline) while :class:`RssSampler`
watches the tracker process's resident memory; :func:`load_problems` and
:func:`ledger_problems` list, in words, every way the run fell short (an
empty list is a clean run).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from nodes_app.protocol.sse import sse_data
from tracker_app.localnet import query_process_database

MIB = 2**20
# A load bench's one key stands for every client: no rate limit, no per-key share in flight.
UNLIMITED_KEY = {
    "MESHNET_RATE_LIMIT_PER_MINUTE": "1000000",
    "MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT": "100000",
    "MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT": "2000000000",
}


@dataclass(frozen=True)
class Chat:
    """One streamed chat of the load: a user prompt and its token budget (greedy)."""

    prompt: str
    max_tokens: int

    def body(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
        }


@dataclass
class Answer:
    """What one client saw of its streamed chat."""

    chat: Chat
    status: int = 0
    text: str = ""
    content_chunks: int = 0  # chunks that carried text
    finish_reason: str | None = None
    completion_tokens: int | None = None
    completion_id: str = ""
    done: bool = False  # the stream ended with "[DONE]"
    error: str | None = None
    first_token_s: float | None = None  # from sending the request to the first text
    elapsed_s: float = 0.0

    @property
    def request_id(self) -> uuid.UUID | None:
        """The tracker's request id (the completion id is ``chatcmpl-<its hex>``)."""
        hex_id = self.completion_id.removeprefix("chatcmpl-")
        try:
            return uuid.UUID(hex=hex_id)
        except ValueError:
            return None

    @property
    def outcome(self) -> tuple[str, int | None, str | None]:
        """(text, completion tokens, finish reason): what two runs of one greedy chat share."""
        return self.text, self.completion_tokens, self.finish_reason


def chat_mix(count: int, *, distinct: int, max_tokens: int) -> list[Chat]:
    """``count`` chats over ``distinct`` different prompts, interleaved: neighbours in the
    load ask different things, so tokens crossing between streams would show."""
    prompts = [f"Tell me about mesh number {i}." for i in range(distinct)]
    return [Chat(prompts[i % distinct], max_tokens) for i in range(count)]


async def stream_chat(client: httpx.AsyncClient, url: str, model: str, chat: Chat) -> Answer:
    """POST ``chat`` to the chat endpoint ``url`` and read the whole stream.

    Never raises for what the tracker answers: a non-200, an ``{"error"}``
    chunk or a broken connection is recorded in :attr:`Answer.error`.
    """
    answer = Answer(chat)
    began = time.perf_counter()
    try:
        async with client.stream("POST", url, json=chat.body(model)) as response:
            answer.status = response.status_code
            if response.status_code != 200:
                answer.error = (await response.aread()).decode(errors="replace")[:300]
                return answer
            async for line in response.aiter_lines():
                answer_take(answer, sse_data(line), began)
    except httpx.HTTPError as error:
        answer.error = f"{type(error).__name__}: {error}"
    finally:
        answer.elapsed_s = time.perf_counter() - began
    return answer


def answer_take(answer: Answer, frame: Any, began: float) -> None:
    """Add one server-sent event's ``frame`` of a chat's stream to what its client saw."""
    if frame == "[DONE]":
        answer.done = True
        return
    if not isinstance(frame, dict):
        return
    if "error" in frame:
        answer.error = str(frame["error"])
        return
    answer.completion_id = frame.get("id", answer.completion_id)
    choice = frame["choices"][0]
    content = choice["delta"].get("content") or ""
    if content:
        if answer.first_token_s is None:
            answer.first_token_s = time.perf_counter() - began
        answer.content_chunks += 1
        answer.text += content
    if choice.get("finish_reason"):
        answer.finish_reason = choice["finish_reason"]
    if "usage" in frame:
        answer.completion_tokens = frame["usage"]["completion_tokens"]


async def run_load(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    chats: Sequence[Chat],
    *,
    concurrency: int | None = None,
) -> list[Answer]:
    """Every chat in ``chats``, all at once (or ``concurrency`` at a time); answers in order."""
    gate = asyncio.Semaphore(concurrency or len(chats) or 1)

    async def one(chat: Chat) -> Answer:
        async with gate:
            return await stream_chat(client, url, model, chat)

    return list(await asyncio.gather(*(one(chat) for chat in chats)))


async def expected_answers(
    client: httpx.AsyncClient, url: str, model: str, chats: Sequence[Chat]
) -> dict[Chat, Answer]:
    """Each distinct chat sent once, alone: the answer its concurrent copies must equal."""
    expected: dict[Chat, Answer] = {}
    for chat in dict.fromkeys(chats):
        expected[chat] = await stream_chat(client, url, model, chat)
    return expected


def load_problems(answers: Sequence[Answer], expected: dict[Chat, Answer]) -> list[str]:
    """Every answer that did not complete, or differs from its chat's lone greedy answer.

    "Differs" covers a lost or repeated token: the text, the usage's
    completion-token count and the finish reason must all equal the lone
    answer's, and the stream must end with ``[DONE]`` after one text chunk per
    token.
    """
    problems = [
        f"the lone answer to {chat.prompt!r} itself failed: {lone.error or lone.status}"
        for chat, lone in expected.items()
        if lone.error or not lone.finish_reason
    ]
    for index, answer in enumerate(answers):
        lone = expected[answer.chat]
        if answer.error is not None or answer.status != 200:
            problems.append(f"chat {index}: HTTP {answer.status}, {answer.error}")
        elif not answer.done or answer.finish_reason is None:
            problems.append(f"chat {index}: the stream ended without a finish_reason and [DONE]")
        elif answer.outcome != lone.outcome:
            problems.append(
                f"chat {index}: {answer.completion_tokens} tokens {answer.text!r} "
                f"({answer.finish_reason}), alone {lone.completion_tokens} tokens "
                f"{lone.text!r} ({lone.finish_reason})"
            )
        elif answer.content_chunks != answer.completion_tokens:
            problems.append(
                f"chat {index}: {answer.content_chunks} text chunks for "
                f"{answer.completion_tokens} tokens"
            )
    return problems


def ledger_problems(database_url: str, answers: Sequence[Answer]) -> list[str]:
    """Every answered chat the tracker did not record as completed, with the client's
    token count and exactly one billing record; and any request id seen twice."""
    ids = [a.request_id for a in answers]
    problems = [f"chat {i}: no completion id" for i, rid in enumerate(ids) if rid is None]
    repeated = [rid for rid, seen in Counter(ids).items() if rid is not None and seen > 1]
    problems += [f"request {rid} answered {Counter(ids)[rid]} chats" for rid in repeated]
    rows = {
        uuid.UUID(str(rid)): (status, tokens, billed)
        for rid, status, tokens, billed in query_process_database(
            database_url,
            "SELECT r.id, r.status, r.completion_tokens, "
            "(SELECT count(*) FROM tracker_app_billingrecord b WHERE b.request_id = r.id) "
            "FROM tracker_app_chatrequest r",
        )
    }
    for index, answer in enumerate(answers):
        if answer.request_id is None:
            continue
        row = rows.get(answer.request_id)
        if row is None:
            problems.append(f"chat {index}: no request row {answer.request_id}")
        elif row != ("completed", answer.completion_tokens, 1):
            status, tokens, billed = row
            problems.append(
                f"chat {index}: recorded {status} with {tokens} tokens and {billed} billing "
                f"records; the client got {answer.completion_tokens} tokens"
            )
    return problems


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0-1) of ``values``."""
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class LoadFigures:
    """One run's time to first token (ms), aggregate throughput and wall time."""

    chats: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    tokens_per_second: float
    seconds: float

    @classmethod
    def of(cls, answers: Sequence[Answer], seconds: float) -> LoadFigures:
        firsts = [a.first_token_s * 1000 for a in answers if a.first_token_s is not None]
        tokens = sum(a.completion_tokens or 0 for a in answers)
        return cls(
            chats=len(answers),
            ttft_p50_ms=statistics.median(firsts) if firsts else math.nan,
            ttft_p99_ms=percentile(firsts, 0.99) if firsts else math.nan,
            tokens_per_second=tokens / seconds if seconds > 0 else math.nan,
            seconds=seconds,
        )

    def line(self) -> str:
        return (
            f"{self.chats} chats in {self.seconds:.1f} s: TTFT p50 {self.ttft_p50_ms:.0f} ms, "
            f"p99 {self.ttft_p99_ms:.0f} ms, {self.tokens_per_second:.0f} tokens/s aggregate"
        )


@dataclass
class RssSampler:
    """The resident memory of process ``pid``, sampled every ``interval`` s in a thread.

    Use as a context manager around the load; :attr:`peak` is the highest sample.
    """

    pid: int
    interval: float = 0.05
    peak: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def rss(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def __enter__(self) -> RssSampler:
        self.peak = self.rss()
        self._thread = threading.Thread(target=self._watch, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, self.rss())

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.rss())
            self.samples += 1


def settled_rss(pid: int, *, window: float = 2.0, limit: float = 20.0, slack: int = MIB) -> int:
    """The RSS of idle process ``pid`` once it stops falling: the lowest reading after it
    changed by less than ``slack`` over ``window`` seconds (or after ``limit`` s)."""
    process = psutil.Process(pid)
    deadline = time.monotonic() + limit
    previous = int(process.memory_info().rss)
    lowest = previous
    while time.monotonic() < deadline:
        time.sleep(window)
        now = int(process.memory_info().rss)
        lowest = min(lowest, now)
        if abs(now - previous) < slack:
            break
        previous = now
    return lowest


@dataclass(frozen=True)
class Footprint:
    """What an idle tracker process holds: resident memory (bytes), open file descriptors,
    connections still open on its ``port`` (clients', and the nodes' own) and threads."""

    rss: int
    fds: int
    client_connections: int
    threads: int

    @classmethod
    def of_idle(cls, pid: int, port: int) -> Footprint:
        """Read once the RSS settled (see :func:`settled_rss`)."""
        rss = settled_rss(pid)
        process = psutil.Process(pid)
        clients = [
            c
            for c in process.net_connections(kind="tcp")
            if c.laddr and c.laddr.port == port and c.status != psutil.CONN_LISTEN
        ]
        return cls(
            rss=rss,
            fds=process.num_fds(),
            client_connections=len(clients),
            threads=process.num_threads(),
        )

    def line(self) -> str:
        return (
            f"{self.rss / MIB:.1f} MiB, {self.fds} fds, {self.client_connections} client "
            f"connections, {self.threads} threads"
        )


@dataclass(frozen=True)
class Memory:
    """The tracker process around a load.

    ``cold``: idle before any concurrent chat; ``baseline``: idle after the
    warm-up round; ``peak_rss``: the highest RSS sampled during the measured
    round; ``after``: idle after it.
    """

    cold: Footprint
    baseline: Footprint
    peak_rss: int
    after: Footprint

    @property
    def rss_grew_by(self) -> int:
        """What the measured round left in RSS (bytes; negative when it shrank)."""
        return self.after.rss - self.baseline.rss

    def lines(self) -> list[str]:
        return [
            f"tracker cold:           {self.cold.line()}",
            f"tracker after warm-up:  {self.baseline.line()}",
            f"tracker peak:           {self.peak_rss / MIB:.1f} MiB",
            f"tracker after the load: {self.after.line()} ({self.rss_grew_by / MIB:+.1f} MiB)",
        ]


def load_client(headers: dict[str, str], *, chats: int, timeout: float) -> httpx.AsyncClient:
    """A client for ``chats`` concurrent chats that keeps no idle connection: like as many
    separate clients, each chat has a connection of its own, closed when it ends."""
    limits = httpx.Limits(max_connections=chats, max_keepalive_connections=0)
    return httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits)


@dataclass(frozen=True)
class LoadRun:
    """A measured load: the lone answers, a warm-up round and the measured round."""

    expected: dict[Chat, Answer]
    warm_up: list[Answer]
    answers: list[Answer]
    figures: LoadFigures
    memory: Memory

    @property
    def every_answer(self) -> list[Answer]:
        return [*self.warm_up, *self.answers]


async def measured_load(
    client: httpx.AsyncClient,
    tracker_url: str,
    model: str,
    chats: Sequence[Chat],
    *,
    tracker_pid: int,
) -> LoadRun:
    """The lone answers, then ``chats`` all at once twice: a warm-up round, then the
    measured one, the tracker's footprint read idle before and after each.

    The warm-up round is the same load: the first burst of concurrency grows
    what a process keeps once grown (the allocator's arenas, the thread pool,
    kept-alive connections to the nodes), so "back to baseline" compares the
    measured round's after with the warm one's before; what it still leaves
    behind is what every such burst would leave, a leak.
    """
    url = f"{tracker_url}/v1/chat/completions"
    port = httpx.URL(tracker_url).port or 80

    def idle() -> Footprint:
        return Footprint.of_idle(tracker_pid, port)

    expected = await expected_answers(client, url, model, chats)
    cold = await asyncio.to_thread(idle)
    warm_up = await run_load(client, url, model, chats)
    baseline = await asyncio.to_thread(idle)
    with RssSampler(tracker_pid) as sampler:
        began = time.perf_counter()
        answers = await run_load(client, url, model, chats)
        seconds = time.perf_counter() - began
    after = await asyncio.to_thread(idle)
    return LoadRun(
        expected=expected,
        warm_up=warm_up,
        answers=answers,
        figures=LoadFigures.of(answers, seconds),
        memory=Memory(cold=cold, baseline=baseline, peak_rss=sampler.peak, after=after),
    )
