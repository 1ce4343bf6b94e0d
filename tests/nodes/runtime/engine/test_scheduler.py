"""The step scheduler in a real NodeService on the tiny model: batched equals alone, and the policy.

Greedy outputs are compared token for token: a session decoded in a batch
with others (joining, leaving, cancelled mid-way) must answer what it answers
alone. The policy tests watch the scheduler's own state (``waiting``, the
sizes of the batches it ran) on a clock the test controls, never wall time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
import torch

from nodes_app.runtime.engine.admission import DEFAULT_RESERVE_POSITIONS
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.kv import bytes_per_position
from nodes_app.runtime.engine.sampler import SamplingParams, TailRequest
from nodes_app.runtime.engine.scheduler import (
    INLINE_STEP_SECONDS,
    LONE_INLINE_STEP_SECONDS,
    RECENT_SECONDS,
)
from nodes_app.runtime.engine.sessions import Session
from nodes_app.runtime.engine.step_batch import ECHO_SCORE_ROWS
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.faults import NonFiniteOutput, RuntimeRequestError
from nodes_app.runtime.hop import step_intake
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.wire.entries import Choice, ForwardStep
from nodes_app.runtime.wire.tensors import tensor_from_bytes, tensor_to_bytes
from nodes_app.shared.sources import resolve_source

TINY = "tiny-random-llama"
GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, seed=0)
GREEDY_TAIL = TailRequest(GREEDY)
PROMPTS = [
    [257, 117, 115, 101, 114, 10, 104, 105, 258, 10, 257, 97],
    [257, 40, 41],
    [257, *range(60, 90), 258],
    [257, 100, 101, 102, 103, 104, 105, 106],
]
NEW_TOKENS = 8


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tiny_service(start: int = 0, end: int = 3, **options) -> NodeService:
    torch.set_num_threads(1)
    shard = load_shard(
        model_key=TINY, source=resolve_source(TINY), start=start, end=end, progress=False
    )
    options.setdefault("kv_budget", 2**30)
    return NodeService(shard, node_id="batching", gate=PlanGate(dev_open=True), **options)


async def head_step(service: NodeService, session: Session, ids: list[int]) -> int:
    async with session.lock:
        choice = await service.head_forward(session, ids, GREEDY_TAIL)
        session.position += len(ids)
    assert isinstance(choice, Choice)
    return choice.token_id


async def decode(
    service: NodeService,
    name: str,
    prompt: list[int],
    *,
    after_token: Callable[[int], Awaitable[None]] | None = None,
) -> list[int]:
    """Greedy tokens of ``prompt`` through the whole model on ``service``'s head."""
    session = service.admission.open_session(name, 0, 3)
    tokens, ids = [], prompt
    try:
        for _ in range(NEW_TOKENS):
            token = await head_step(service, session, ids)
            tokens.append(token)
            ids = [token]
            if after_token is not None:
                await after_token(len(tokens))
    finally:
        service.cancel(name)
    return tokens


def alone(prompt: list[int]) -> list[int]:
    async def run() -> list[int]:
        service = tiny_service()
        try:
            return await decode(service, "alone", prompt)
        finally:
            service.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def alone_outputs() -> list[list[int]]:
    return [alone(prompt) for prompt in PROMPTS]


def test_every_session_in_a_batch_decodes_what_it_decodes_alone(
    alone_outputs: list[list[int]],
) -> None:
    async def run() -> tuple[list[list[int]], list[int]]:
        service = tiny_service()
        try:
            outputs = await asyncio.gather(
                *(decode(service, f"s{i}", prompt) for i, prompt in enumerate(PROMPTS))
            )
            return list(outputs), list(service.scheduler.batch_sizes)
        finally:
            service.close()

    outputs, sizes = asyncio.run(run())
    assert outputs == alone_outputs
    assert max(sizes) == len(PROMPTS)  # the decode steps really ran as one batch


def test_a_session_joining_mid_batch_and_one_cancelled_mid_batch_leave_the_others_intact(
    alone_outputs: list[list[int]],
) -> None:
    async def run() -> tuple[list[int], list[int], list[int], list[int]]:
        service = tiny_service(prefill_chunk=4)  # the newcomer's prefill runs in chunks
        joined = asyncio.Event()

        async def let_in(count: int) -> None:
            if count == 3:
                joined.set()

        async def newcomer() -> list[int]:
            await joined.wait()
            return await decode(service, "late", PROMPTS[2])

        cancelled = asyncio.create_task(decode(service, "doomed", PROMPTS[3]))

        async def cancel_doomed(count: int) -> None:
            if count == 2:
                cancelled.cancel()

        try:
            first, second, late = await asyncio.gather(
                decode(service, "first", PROMPTS[0], after_token=let_in),
                decode(service, "second", PROMPTS[1], after_token=cancel_doomed),
                newcomer(),
            )
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            assert service.store.get("doomed") is None
            return first, second, late, list(service.scheduler.batch_sizes)
        finally:
            service.close()

    first, second, late, sizes = asyncio.run(run())
    assert (first, second, late) == (alone_outputs[0], alone_outputs[1], alone_outputs[2])
    assert max(sizes) >= 3


def test_a_session_closed_while_its_step_waits_is_answered_and_the_batch_runs_without_it(
    alone_outputs: list[list[int]],
) -> None:
    async def run() -> tuple[list[int], RuntimeRequestError]:
        service = tiny_service()
        try:
            kept = service.admission.open_session("kept", 0, 3)
            closed = service.admission.open_session("closed", 0, 3)
            # Both queued before the scheduler runs (two prefills: one after the other)...
            steps = [
                asyncio.ensure_future(service.head_forward(kept, PROMPTS[1], GREEDY_TAIL)),
                asyncio.ensure_future(service.head_forward(closed, PROMPTS[1], GREEDY_TAIL)),
            ]
            await asyncio.sleep(0)
            service.cancel("closed")  # ...but one leaves before it runs.
            choice = await steps[0]
            with pytest.raises(RuntimeRequestError) as refused:
                await steps[1]
            assert isinstance(choice, Choice)
            return [choice.token_id], refused.value
        finally:
            service.close()

    (token,), error = asyncio.run(run())
    assert token == alone_outputs[1][0]
    assert error.code == "unknown_session"


def test_a_lone_step_runs_at_once_whatever_the_wait_bound() -> None:
    async def run() -> tuple[bool, int]:
        service = tiny_service(batch_wait=3600.0)
        try:
            session = service.admission.open_session("lone", 0, 3)
            step = asyncio.ensure_future(head_step(service, session, PROMPTS[1]))
            await asyncio.sleep(0)
            held = service.scheduler.waiting
            await step
            # Its next step too: it is the only recently active session.
            step = asyncio.ensure_future(head_step(service, session, [65]))
            await asyncio.sleep(0)
            held = held or service.scheduler.waiting
            await step
            return held, service.scheduler.depth
        finally:
            service.close()

    assert asyncio.run(run()) == (False, 0)


def test_a_lone_sessions_slower_step_runs_on_the_event_loop_and_a_shared_one_on_the_torch_thread(
    alone_outputs: list[list[int]],
) -> None:
    # Every step takes ~5 ms: past the short-batch bound, within the lone-session one.
    pause = 5 * INLINE_STEP_SECONDS / 2
    assert INLINE_STEP_SECONDS < pause < LONE_INLINE_STEP_SECONDS
    on_loop: list[bool] = []

    def slow(hidden: torch.Tensor) -> torch.Tensor:
        time.sleep(pause)
        on_loop.append(threading.current_thread() is threading.main_thread())
        return hidden

    async def run() -> tuple[list[int], list[bool], list[list[int]], list[bool]]:
        # Sessions active together wait for each other: their steps run as batches of two.
        service = tiny_service(batch_wait=3600.0)
        service.scheduler.transform = slow
        try:
            lone = await decode(service, "lone", PROMPTS[0])
            lone_steps = on_loop[:]
            on_loop.clear()
            shared = await asyncio.gather(
                decode(service, "a", PROMPTS[1]), decode(service, "b", PROMPTS[2])
            )
            return lone, lone_steps, list(shared), on_loop[:]
        finally:
            service.close()

    lone, lone_steps, shared, shared_steps = asyncio.run(run())

    assert lone == alone_outputs[0] and shared == alone_outputs[1:3]
    # The prompt and the first decode step (nothing measured yet) on the thread, then the loop.
    assert lone_steps == [False, False] + [True] * (NEW_TOKENS - 2)
    assert not any(shared_steps)


def test_a_step_waits_for_a_recently_active_session_then_runs_with_it_as_one_batch() -> None:
    clock = Clock()

    async def run() -> tuple[bool, int, bool]:
        service = tiny_service(batch_wait=3600.0)
        service.scheduler.clock = clock
        try:
            a, b = (
                service.admission.open_session("a", 0, 3),
                service.admission.open_session("b", 0, 3),
            )
            await asyncio.gather(
                head_step(service, a, PROMPTS[1]), head_step(service, b, PROMPTS[1])
            )
            step_a = asyncio.ensure_future(head_step(service, a, [65]))
            await asyncio.sleep(0)
            held_for_b = service.scheduler.waiting
            await head_step(service, b, [66])
            await step_a
            together = service.scheduler.batch_sizes[-1]
            # b goes quiet past the recent window: a is no longer held for it.
            clock.now += RECENT_SECONDS + 1
            step_a = asyncio.ensure_future(head_step(service, a, [67]))
            await asyncio.sleep(0)
            held_again = service.scheduler.waiting
            await step_a
            return held_for_b, together, held_again
        finally:
            service.close()

    assert asyncio.run(run()) == (True, 2, False)


def test_a_burst_of_short_prompts_is_prefilled_in_one_turn_between_two_decode_steps() -> None:
    async def run() -> list[str]:
        service = tiny_service(prefill_chunk=64)
        finished: list[str] = []

        async def keep_decoding(session: Session) -> None:
            for token in range(65, 70):
                await head_step(service, session, [token])
                finished.append("decode")

        async def prefill(session: Session, prompt: list[int]) -> None:
            await head_step(service, session, prompt)
            finished.append("prefill")

        try:
            running = service.admission.open_session("running", 0, 3)
            await head_step(service, running, PROMPTS[1])
            decoding = asyncio.ensure_future(keep_decoding(running))
            await asyncio.sleep(0)  # its first step holds the torch thread
            newcomers = [service.admission.open_session(f"new-{i}", 0, 3) for i in range(3)]
            await asyncio.gather(*(prefill(s, PROMPTS[i]) for i, s in enumerate(newcomers)))
            await decoding
            return finished
        finally:
            service.close()

    # Prompts of 12, 3 and 32 positions fit one turn of 64 positions: after the
    # step that was running when they came, none waits for another decode step.
    order = asyncio.run(run())
    assert order[:4] == ["decode", "prefill", "prefill", "prefill"], order


def test_a_chunked_prefill_on_a_middle_hop_answers_every_position_as_one_piece_would() -> None:
    hidden = torch.randn(1, 11, 64, generator=torch.Generator().manual_seed(3))
    body = tensor_to_bytes(hidden)

    def hop_output(chunk: int) -> torch.Tensor:
        async def run() -> bytes | Choice:
            service = tiny_service(prefill_chunk=chunk)
            step = ForwardStep("mid", 1, 2, 0, "float32", (1, 11, 64), None)
            try:
                return await step_intake.forward(service, step, body)
            finally:
                service.close()

        out = asyncio.run(run())
        assert isinstance(out, bytes)
        return tensor_from_bytes(out, "float32", (1, 11, 64))

    torch.testing.assert_close(hop_output(3), hop_output(128), rtol=1e-5, atol=1e-6)


def test_one_sessions_non_finite_output_fails_it_alone(alone_outputs: list[list[int]]) -> None:
    async def run() -> tuple[int, BaseException | int]:
        service = tiny_service()

        def poison_second_row(out: torch.Tensor) -> torch.Tensor:
            if out.shape[0] == 2:
                out = out.clone()
                out[1] = float("nan")
            return out

        try:
            good, bad = (
                service.admission.open_session("good", 0, 3),
                service.admission.open_session("bad", 0, 3),
            )
            first = await head_step(service, good, PROMPTS[1])
            await head_step(service, bad, PROMPTS[1])
            service.scheduler.transform = poison_second_row
            results = await asyncio.gather(
                head_step(service, good, [first]),
                head_step(service, bad, [first]),
                return_exceptions=True,
            )
            assert isinstance(results[0], int)
            return results[0], results[1]
        finally:
            service.close()

    token, failure = asyncio.run(run())
    assert token == alone_outputs[1][1]
    assert isinstance(failure, NonFiniteOutput)


def test_a_node_refuses_sessions_past_its_kv_budget_and_admits_again_when_one_ends() -> None:
    async def run() -> None:
        probe = tiny_service()
        probe.close()
        budget = 100 * bytes_per_position(probe.shard, 0, 3)
        service = tiny_service(kv_budget=budget)
        try:
            service.admission.open_session("first", 0, 3, reserve=60)
            with pytest.raises(RuntimeRequestError) as refused:
                service.admission.open_session("second", 0, 3, reserve=60)
            assert (refused.value.code, refused.value.status) == ("node_busy", 503)
            health = service.health()
            assert health["kv_reserved_bytes"] == 60 * bytes_per_position(service.shard, 0, 3)
            assert health["kv_budget_bytes"] == budget
            service.cancel("first")
            assert service.admission.open_session("second", 0, 3, reserve=60).session_id == "second"
        finally:
            service.close()

    asyncio.run(run())


def test_a_hop_reserves_what_the_head_says_the_session_may_reach() -> None:
    async def run() -> tuple[int, int]:
        service = tiny_service(start=0, end=3)
        hidden = torch.zeros(1, 5, 64)
        try:
            told = ForwardStep("told", 2, 3, 0, "float32", (1, 5, 64), GREEDY, reserve=40)
            untold = ForwardStep("untold", 2, 3, 0, "float32", (1, 5, 64), GREEDY)
            for step in (told, untold):
                await step_intake.forward(service, step, tensor_to_bytes(hidden))
            return service.store.get("told").reserve, service.store.get("untold").reserve  # type: ignore[union-attr]
        finally:
            service.close()

    assert asyncio.run(run()) == (40, 5 + DEFAULT_RESERVE_POSITIONS)


# --- each row of a batch chooses and reports with its own session's parameters ---

# Each session's opening step (an echo for some) and its later steps.
MIXED = [
    (
        TailRequest(GREEDY, logprobs=3, prompt_ids=tuple(PROMPTS[0])),
        TailRequest(GREEDY, logprobs=3),
    ),
    (TailRequest(GREEDY), TailRequest(GREEDY)),
    (
        TailRequest(
            SamplingParams(frequency_penalty=1.5, presence_penalty=0.5),
            logprobs=1,
            generated_ids=(65, 65, 32),
        ),
        TailRequest(SamplingParams(frequency_penalty=1.5, presence_penalty=0.5), logprobs=1),
    ),
    (
        TailRequest(SamplingParams(temperature=0.9, seed=7, logit_bias=((101, 3.0), (32, -100.0)))),
        TailRequest(SamplingParams(temperature=0.9, seed=7, logit_bias=((101, 3.0), (32, -100.0)))),
    ),
]


async def choices_of(
    service: NodeService, name: str, prompt: list[int], opening: TailRequest, later: TailRequest
) -> list[Choice]:
    """A session's choices: its prefill with ``opening``, then later steps with ``later``."""
    session = service.admission.open_session(name, 0, 3)
    choices: list[Choice] = []
    ids = prompt
    try:
        for _ in range(NEW_TOKENS):
            async with session.lock:
                choice = await service.head_forward(session, ids, later if choices else opening)
                session.position += len(ids)
            assert isinstance(choice, Choice)
            choices.append(choice)
            ids = [choice.token_id]
    finally:
        service.cancel(name)
    return choices


def assert_same_choices(got: list[Choice], expected: list[Choice]) -> None:
    """The same tokens, and the same scores up to float rounding (a batch pads its rows)."""
    assert [c.token_id for c in got] == [c.token_id for c in expected]
    for mine, theirs in zip(got, expected, strict=True):
        assert (mine.score is None) == (theirs.score is None)
        for a, b in zip((mine.score, *mine.prompt), (theirs.score, *theirs.prompt), strict=True):
            if a is not None and b is not None:
                assert [t for t, _ in a.top] == [t for t, _ in b.top]
                assert [a.logprob, *(v for _, v in a.top)] == pytest.approx(
                    [b.logprob, *(v for _, v in b.top)], abs=1e-5
                )


def test_sessions_with_their_own_penalties_bias_and_logprobs_each_get_their_lone_answer() -> None:
    async def run() -> tuple[list[list[Choice]], list[list[Choice]], list[int]]:
        service = tiny_service()
        try:
            alone = [
                await choices_of(service, f"alone-{i}", PROMPTS[i], *MIXED[i])
                for i in range(len(MIXED))
            ]
            together = await asyncio.gather(
                *(
                    choices_of(service, f"mixed-{i}", PROMPTS[i], *MIXED[i])
                    for i in range(len(MIXED))
                )
            )
            return alone, list(together), list(service.scheduler.batch_sizes)
        finally:
            service.close()

    alone, together, sizes = asyncio.run(run())
    assert max(sizes) == len(MIXED)  # their decode steps really shared a batch
    for mine, lone in zip(together, alone, strict=True):
        assert_same_choices(mine, lone)
    assert len(together[0][0].prompt) == len(PROMPTS[0]) - 1  # the echo
    assert all(c.score is None for c in together[1])  # the plain session reports nothing
    assert 32 not in {c.token_id for c in together[3]}  # its bias bans the space


def test_an_echo_scores_every_prompt_token_whatever_the_prefill_chunk() -> None:
    # Longer than ECHO_SCORE_ROWS, so a whole-prompt chunk is scored in pieces too.
    prompt = [257, *range(32, 240)]
    echo = TailRequest(GREEDY, logprobs=2, prompt_ids=tuple(prompt))
    later = TailRequest(GREEDY, logprobs=2)

    def prefill(chunk: int) -> tuple[Choice, int]:
        """The echo's choice, and the most positions turned into logits at once."""

        async def run() -> tuple[Choice, int]:
            service = tiny_service(prefill_chunk=chunk)
            runner, widest = service.runner, [0]
            full_logits = runner.logits

            def logits(hidden: torch.Tensor) -> torch.Tensor:
                widest[0] = max(widest[0], hidden.shape[1])
                return full_logits(hidden)

            runner.logits = logits  # type: ignore[method-assign]
            try:
                [choice] = (await choices_of(service, "echo", prompt, echo, later))[:1]
                return choice, widest[0]
            finally:
                service.close()

        return asyncio.run(run())

    (chunked, _), (whole, widest) = prefill(3), prefill(1024)
    assert len(whole.prompt) == len(prompt) - 1
    assert_same_choices([chunked], [whole])
    # An echo's memory does not grow with the prefill chunk.
    assert widest == ECHO_SCORE_ROWS < len(prompt)
