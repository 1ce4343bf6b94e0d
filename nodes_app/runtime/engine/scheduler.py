"""The step scheduler: every forward step of a node is queued here and batched across sessions.

It decides which steps run together and when; ``step_batch`` runs them
(the layers, then each row's choice with its own session's picker, an
echo's prompt scores, or a middle hop's hidden bytes). Decode steps (one
position each) of different sessions that are ready together run as one
batched forward. Sessions join and leave between batches; a step of a
cancelled or closed session is dropped before it runs; one session's
non-finite output fails that session alone.

Policy (ADR-0010):

- **A lone step runs at once.** A decode step waits only while other
  sessions that finished a step recently (``RECENT_SECONDS``) have not yet
  submitted their next one, and never longer than ``max_wait`` with the
  torch thread idle (counted from the later of its arrival and the end of
  the last batch). While a batch runs, new steps simply queue: that
  queueing is the batching, and adds no wait of its own.
- **Prefill is chunked.** A step of many positions runs ``prefill_chunk``
  positions at a time, its chunks alternating with decode batches, so a
  newcomer's long prompt does not stall the sessions already decoding. A
  prefill turn runs several short prompts back to back, up to
  ``prefill_chunk`` positions in all, so a burst of newcomers is not
  admitted one per decode batch. A
  middle hop still answers every position's hidden states; the last layer
  samples from the last chunk's last position only.
- **A batch ends in one event-loop callback.** Every future of a batch is
  resolved by one ``loop.call_soon_threadsafe``, so the head's generations
  continue in the same loop tick and their next-hop messages go out together.
- **A short decode batch runs on the event loop.** Handing a step to the
  torch thread and back costs two thread wake-ups and a self-pipe write
  (~0.1 ms of CPU, more of wall clock): a decode batch that the node's own
  recent batches say takes under ``INLINE_STEP_SECONDS`` (a tiny model, or
  a fast accelerator at small batch) runs where it was queued, so the loop
  is held no longer than that.
- **So does a lone session's decode step.** With no other session active,
  the loop has nothing to do beside the step but wait for it, and the
  hand-off is all cost: on a real model more than on the tiny one, because
  the Python around it runs after the step has streamed the weights through
  the CPU's caches (1-3 % of a SmolLM2 token on two nodes,
  bench/bench_proxy_stream.py). A decode batch of one session, with nothing
  else queued and no other session active in the last ``RECENT_SECONDS``,
  runs on the loop when expected under ``LONE_INLINE_STEP_SECONDS``: a
  health check, a heartbeat or a newcomer's first frame then waits at most
  about that long. Prefills, batches of several sessions (whose loop work
  overlaps the step on the thread) and longer steps run on the torch
  thread.

Other torch work runs on the node's one torch thread (the ``worker`` given);
the queue and the policy live on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from nodes_app.runtime.engine.capacity import DEFAULT_MAX_WAIT_SECONDS, DEFAULT_PREFILL_CHUNK
from nodes_app.runtime.engine.runner import ShardRunner
from nodes_app.runtime.engine.sampler import TailRequest
from nodes_app.runtime.engine.sessions import Session
from nodes_app.runtime.engine.step_batch import More, Outcome, StepJob, run_step_batch
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.wire.entries import Choice

# Rows of one batched forward at most; the KV budget bounds sessions anyway.
MAX_BATCH = 64
# A session whose last step ended longer ago than this is not waited for.
RECENT_SECONDS = 0.5
# A decode batch expected to take less than this runs on the event loop (see above):
# a health check or link read then waits at most about this long.
INLINE_STEP_SECONDS = 0.002
# A lone session's decode step expected to take less than this runs on the event loop.
LONE_INLINE_STEP_SECONDS = 0.25
# Weight of the newest decode batch in the expected duration of the next one.
_STEP_ALPHA = 0.2


class ThroughputMeter:
    """Exponentially weighted decode steps/s that one session sees (one batch: one step each)."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.tps = 0.0

    def record(self, tokens: int, seconds: float) -> None:
        if tokens != 1 or seconds <= 0:
            return
        sample = 1.0 / seconds
        self.tps = sample if self.tps == 0 else self.alpha * sample + (1 - self.alpha) * self.tps


class StepScheduler:
    """Queues steps, forms batches by the policy above, runs them on the torch thread."""

    def __init__(
        self,
        runner: ShardRunner,
        worker: ThreadPoolExecutor,
        *,
        max_wait: float = DEFAULT_MAX_WAIT_SECONDS,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_wait < 0 or prefill_chunk < 1:
            raise ValueError("max_wait must be >= 0 and prefill_chunk >= 1")
        self.runner = runner
        self.worker = worker
        self.max_wait = max_wait
        self.prefill_chunk = prefill_chunk
        # TEST ONLY hook (the node's --corrupt-hidden-states): applied to every output.
        self.transform = transform
        self.clock = clock
        self.meter = ThroughputMeter()
        # Sizes of the batches run so far, newest last (a short window, for health and tests).
        self.batch_sizes: deque[int] = deque(maxlen=64)
        # Steps run in a batch of more than one session, since the node started.
        self.batched_steps = 0
        self._decodes: list[StepJob] = []
        self._prefills: deque[StepJob] = deque()
        self._running = 0
        self._prefill_turn = False
        self._timer: asyncio.TimerHandle | None = None
        self._recent: dict[str, float] = {}
        self._free_since = clock()
        # Expected seconds of the next decode batch (EWMA of those run; inf: none yet).
        self._decode_seconds = float("inf")

    @property
    def depth(self) -> int:
        """Steps waiting or running."""
        return len(self._decodes) + len(self._prefills) + self._running

    async def submit(
        self,
        session: Session,
        *,
        tail: TailRequest | None,
        tokens: list[int] | None = None,
        hidden: torch.Tensor | None = None,
        ids: list[int] | None = None,
        drafts: int = 0,
    ) -> bytes | Choice:
        """The step's result: hidden-state bytes, or (with ``tail``: the last layer) the choice.

        ``drafts``: the step is a draft round whose last ``drafts`` positions
        are proposed tokens (ADR-0028); it runs as a prefill does, in a forward
        of its own between decode batches, but whole.

        A last-layer step needs the session's ``picker`` (a
        :class:`~nodes_app.runtime.engine.sampler.TokenPicker`). The session's
        position is the caller's to advance, after the result; raises
        :class:`NonFiniteOutput` when this session's output is not finite.
        """
        loop = asyncio.get_running_loop()
        job = StepJob(
            session=session,
            tail=tail,
            future=loop.create_future(),
            arrived=self.clock(),
            tokens=tokens,
            hidden=hidden,
            ids=ids,
            drafts=drafts,
        )
        if job.length == 1:
            self._decodes.append(job)
        else:
            self._prefills.append(job)
        self._kick(loop)
        return await job.future

    def forget(self, session_id: str) -> None:
        """A session ended: never wait for its next step."""
        self._recent.pop(session_id, None)

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the next batch if the torch thread is free and the policy says go."""
        if self._running:
            return
        self._decodes = [job for job in self._decodes if not self._settle_abandoned(job)]
        self._prefills = deque(job for job in self._prefills if not self._settle_abandoned(job))
        if not self._decodes and not self._prefills:
            self._cancel_timer()
            return
        if self._prefills and (not self._decodes or self._prefill_turn):
            forwards = self._take_prefills()
            self._prefill_turn = decoding = False
        else:
            wait = self._wait_left()
            if wait > 0:
                if self._timer is None:
                    self._timer = loop.call_later(wait, self._on_timer, loop)
                return
            forwards = [self._take_decodes()]
            self._prefill_turn = decoding = True
        self._cancel_timer()
        self._running = sum(len(batch) for batch in forwards)
        if decoding and self._runs_inline(forwards[0]):
            self._finish(forwards, self._outcomes(forwards), loop)
        else:
            self.worker.submit(self._run, forwards, loop)

    def _runs_inline(self, batch: list[StepJob]) -> bool:
        """Whether a decode batch runs on the event loop rather than the torch thread (above)."""
        expected = self._decode_seconds
        if expected < INLINE_STEP_SECONDS:
            return True
        if len(batch) > 1 or self._decodes or self._prefills:
            return False
        alone = self._recent.keys() <= {batch[0].session.session_id}
        return alone and expected < LONE_INLINE_STEP_SECONDS

    @staticmethod
    def _settle_abandoned(job: StepJob) -> bool:
        """Whether ``job`` is not to run: its caller left, or its session was closed (answered)."""
        if job.session.closed and not job.future.done():
            job.future.set_exception(
                RuntimeRequestError(
                    f"session {job.session.session_id} was cancelled", code="unknown_session"
                )
            )
        return job.abandoned

    @property
    def waiting(self) -> bool:
        """Whether ready decode steps are being held back for other sessions' steps."""
        return self._timer is not None

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._kick(loop)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wait_left(self) -> float:
        """Seconds the waiting decode steps may still wait for recently active sessions."""
        now = self.clock()
        for sid, ended in list(self._recent.items()):
            if now - ended > RECENT_SECONDS:
                del self._recent[sid]
        # Counted from when the torch thread fell free, not from arrival: steps that
        # queued behind a running batch wait for that batch's sessions to come
        # back (they do within the loop tick that ended it), so two groups of
        # sessions merge into one batch instead of alternating forever.
        since = max(min(job.arrived for job in self._decodes), self._free_since)
        left = since + self.max_wait - now
        if left <= 0:
            return 0.0
        queued = {job.session.session_id for job in (*self._decodes, *self._prefills)}
        return left if any(sid not in queued for sid in self._recent) else 0.0

    def _take_prefills(self) -> list[list[StepJob]]:
        """The next prefill chunks of one turn, each its own forward: ``prefill_chunk`` positions.

        Short prompts share a turn (at least one chunk runs), so a burst of
        newcomers is not served one per decode batch.
        """
        forwards: list[list[StepJob]] = []
        budget = self.prefill_chunk
        while self._prefills:
            job = self._prefills[0]
            length = self._chunk(job)
            if forwards and length > budget:
                break
            forwards.append([self._prefills.popleft()])
            budget -= length
        return forwards

    def _chunk(self, job: StepJob) -> int:
        """Positions ``job``'s next prefill chunk runs: ``prefill_chunk`` at most, and ending
        on its prefill's last block boundary when its linear-attention states are
        snapshotted there (prefix reuse, ADR-0027: ``SessionKV.ran``)."""
        if job.drafts:  # verified on every position's logits: never cut
            return job.length
        length = min(self.prefill_chunk, job.length - job.done)
        block = getattr(job.session.cache, "snapshot_block", None)
        if block:
            past = job.session.position + job.done
            boundary = (job.session.position + job.length) // block * block
            if past < boundary < past + length:
                length = boundary - past
        return length

    def _take_decodes(self) -> list[StepJob]:
        """The oldest decode step and those of the same layer range, up to ``MAX_BATCH``.

        A family whose layers read the past length off the cache (Llama 4)
        batches only steps at the same position.
        """
        shared = self.runner.family.rows_share_past

        def group(job: StepJob) -> tuple[int, int, int]:
            session = job.session
            return session.start, session.end, session.position if shared else 0

        first = group(self._decodes[0])
        batch: list[StepJob] = []
        rest: list[StepJob] = []
        for job in self._decodes:
            same = group(job) == first
            (batch if same and len(batch) < MAX_BATCH else rest).append(job)
        self._decodes = rest
        return batch

    def _run(self, forwards: list[list[StepJob]], loop: asyncio.AbstractEventLoop) -> None:
        """On the torch thread: run each forward, then hand every outcome back in one callback."""
        outcomes = self._outcomes(forwards)
        with contextlib.suppress(RuntimeError):  # the loop closed while the node stopped
            loop.call_soon_threadsafe(self._finish, forwards, outcomes, loop)

    def _outcomes(self, forwards: list[list[StepJob]]) -> list[list[Outcome]]:
        """Run each forward: every job's outcome, batch by batch."""
        outcomes: list[list[Outcome]] = []
        for batch in forwards:
            try:
                outcomes.append(self._compute(batch))
            except Exception as error:  # one failed forward fails its batch, not the node
                outcomes.append([error] * len(batch))
        return outcomes

    def _compute(self, batch: list[StepJob]) -> list[Outcome]:
        """Run ``batch`` (``step_batch``), and learn how long a decode batch takes."""
        began = time.perf_counter()
        first = batch[0]
        length = self._chunk(first) if first.length > 1 else 1
        outcomes = run_step_batch(self.runner, batch, length, self.transform)
        if length == 1:
            seconds = time.perf_counter() - began
            self.meter.record(1, seconds)
            expected = self._decode_seconds
            self._decode_seconds = (
                seconds
                if expected == float("inf")
                else expected + _STEP_ALPHA * (seconds - expected)
            )
        return outcomes

    def _finish(
        self,
        forwards: list[list[StepJob]],
        outcomes: list[list[Outcome]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._running = 0
        for batch in forwards:
            self.batch_sizes.append(len(batch))
            if len(batch) > 1:
                self.batched_steps += len(batch)
        now = self._free_since = self.clock()
        done = zip(
            (job for batch in forwards for job in batch),
            (outcome for results in outcomes for outcome in results),
            strict=True,
        )
        for job, outcome in done:
            if isinstance(outcome, More):
                self._prefills.appendleft(job)  # the next _kick settles it if abandoned
                continue
            if not job.session.closed:
                self._recent[job.session.session_id] = now
            if job.future.done():
                continue
            if isinstance(outcome, BaseException):
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)
        self._kick(loop)
