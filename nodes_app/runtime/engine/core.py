"""A node's serving state: the shard, its sessions, the step scheduler and the torch thread.

Every forward step goes through the :class:`~nodes_app.runtime.engine.scheduler.StepScheduler`,
which batches decode steps across sessions and runs them on the node's one
torch thread (a decode batch shorter than ``scheduler.INLINE_STEP_SECONDS`` on
the event loop itself); other torch-side work (tokenising) runs on the thread via
:meth:`NodeService.compute`. So the event loop stays responsive (health
checks, cancels) while a step runs, and torch sees one caller. Session
bookkeeping (admission against the KV budget, positions, capabilities)
happens on the event loop only.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from nodes_app.protocol.limits import (
    GENERATE_MAX_BYTES,
    GENERATE_MAX_PROMPT_CHARS,
    SAMPLING,
    STEP_TIMEOUT_SECONDS,
)
from nodes_app.runtime.engine.admission import Admission
from nodes_app.runtime.engine.capacity import DEFAULT_MAX_WAIT_SECONDS, DEFAULT_PREFILL_CHUNK
from nodes_app.runtime.engine.kv import default_kv_budget
from nodes_app.runtime.engine.prefix_cache import MISS, Hit, local_keys
from nodes_app.runtime.engine.runner import ShardRunner
from nodes_app.runtime.engine.sampler import Constraint, SamplingParams, TailRequest, TokenPicker
from nodes_app.runtime.engine.scheduler import StepScheduler, ThroughputMeter
from nodes_app.runtime.engine.sessions import (
    IDLE_TIMEOUT_SECONDS,
    DraftRound,
    Session,
    SessionStore,
)
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.loading.shard import LoadedShard
from nodes_app.runtime.wire.entries import Choice, ForwardStep
from nodes_app.runtime.wire.tensors import DTYPE_NAMES
from nodes_app.shared.grammar import grammar_words

T = TypeVar("T")


class NodeService:
    def __init__(
        self,
        shard: LoadedShard,
        *,
        node_id: str,
        kv_budget: int | None = None,
        max_sessions: int | None = None,
        batch_wait: float = DEFAULT_MAX_WAIT_SECONDS,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        idle_timeout: float = IDLE_TIMEOUT_SECONDS,
        benchmark_tps: float = 0.0,
        corrupt_hidden_states: float = 0.0,
        gate: PlanGate | None = None,
        max_request_bytes: int = GENERATE_MAX_BYTES,
        max_prompt_chars: int = GENERATE_MAX_PROMPT_CHARS,
        step_timeout: float = STEP_TIMEOUT_SECONDS,
    ) -> None:
        self.shard = shard
        # Closed unless given: no pinned tracker key, not dev-open.
        self.gate = gate or PlanGate()
        self.runner = ShardRunner(shard)
        self.store = SessionStore(
            kv_budget=default_kv_budget(shard.device) if kv_budget is None else kv_budget,
            max_sessions=max_sessions,
            idle_timeout=idle_timeout,
        )
        self.admission = Admission(
            shard, node_id=node_id, store=self.store, gate=self.gate, runner=self.runner
        )
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshnet-torch")
        self.scheduler = StepScheduler(
            self.runner,
            self.worker,
            max_wait=batch_wait,
            prefill_chunk=prefill_chunk,
            transform=self._corrupt,
        )
        self.dtype_name = DTYPE_NAMES[shard.dtype]
        # A head's draft model (ADR-0028): a smaller model of the same tokenizer, loaded
        # whole, whose greedy guesses the route verifies; None: drafts from the prompt only.
        self.draft: ShardRunner | None = None
        self.computing = 0
        self.streams = 0
        self.benchmark_tps = benchmark_tps
        # What a head reads of a generate request before it tokenises anything.
        self.max_request_bytes = max_request_bytes
        self.max_prompt_chars = max_prompt_chars
        # What a downstream hop has to answer one step this node sends it
        # (step_time_limit); past it the hop is reported hung.
        self.step_timeout = step_timeout
        # TEST ONLY (``runnode --corrupt-hidden-states``): a node that silently
        # computes wrong, which the tracker's route probe must catch.
        self.corrupt_hidden_states = corrupt_hidden_states

    @property
    def node_id(self) -> str:
        """The id this node serves under (the tracker's, once registered); plans must name it."""
        return self.admission.node_id

    @node_id.setter
    def node_id(self, node_id: str) -> None:
        self.admission.node_id = node_id

    async def compute(self, work: Callable[[], T]) -> T:
        """Run ``work`` (not a forward step: those go through the scheduler) on the torch thread."""
        self.computing += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.worker, work)
        finally:
            self.computing -= 1

    @property
    def queued(self) -> int:
        """Jobs waiting for or running on the torch thread (the heartbeat's queue depth)."""
        return self.computing + self.scheduler.depth

    @property
    def meter(self) -> ThroughputMeter:
        return self.scheduler.meter

    def prefix_keys(self, hashes: Sequence[str], start: int, end: int, scope: str) -> list[bytes]:
        """This node's keys of a request's chain for layers ``start..end`` (ADR-0027)."""
        return local_keys(
            hashes,
            model=self.shard.model_key,
            start=start,
            end=end,
            dtype=self.dtype_name,
            scope=scope,
        )

    async def claim(self, session: Session, hashes: Sequence[str], scope: str | None) -> Hit:
        """Find the chain ``hashes``' longest held prefix and copy it into the new ``session``.

        ``scope``: what its plan shares the cache in ("" where no signed plan
        says: a dev-open node trusts the chain the head seeded); None keeps the
        request out of the cache: nothing is looked up, nothing kept at its end.
        The session then stands at the positions taken until its first step
        settles where the route starts (:meth:`settle`).
        """
        session.claimed = True
        session.prefix_scope = scope
        if scope is None or not hashes:
            return MISS
        cache = self.store.prefix
        hit = cache.find(self.prefix_keys(hashes, session.start, session.end, scope))
        if hit.blocks:
            session.position = await self.compute(lambda: cache.take(hit, session.cache))
        return Hit(hit.blocks, hit.exact)

    def settle(self, session: Session, position: int) -> None:
        """A claimed session's first step starts at ``position``: cut what it took back to it.

        Refuses (``position_mismatch``) a position its state cannot resume at.
        """
        if not session.claimed:
            return
        if position != session.position:
            if position > session.position or not session.cache.resumable(position):
                raise RuntimeRequestError(
                    f"session {session.session_id} cannot start at position {position}",
                    code="position_mismatch",
                )
            session.cache.truncate(position)
            session.position = position
        session.claimed = False
        self.store.prefix.counted(position)

    def end(self, session_id: str, hashes: Sequence[str] | None = None) -> bool:
        """A generation's session ended cleanly: keep its state under the chain ``hashes``
        (of every token it ran) when its request may share it (ADR-0027)."""
        session = self.store.get(session_id)
        if session is None:
            return False
        self.scheduler.forget(session_id)
        scope = session.prefix_scope
        keys = None
        if scope is not None and hashes:
            keys = self.prefix_keys(hashes, session.start, session.end, scope)
        return self.store.end(session_id, keys)

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "node_id": self.node_id,
            "model": self.shard.model_key,
            "shard": {"start": self.shard.start, "end": self.shard.end},
            "num_layers": self.shard.num_layers,
            "dtype": self.dtype_name,
            "is_head": self.can_head,
            "active_sessions": len(self.store),
            "cached_sessions": len(self.store),
            "streams": self.streams,
            "queue_depth": self.queued,
            "max_sessions": self.store.max_sessions,
            "kv_budget_bytes": self.store.kv_budget,
            "kv_reserved_bytes": self.store.reserved,
            "batched_steps": self.scheduler.batched_steps,
            "prefix_cache": self.store.prefix.stats(),
            "measured_tps": round(self.meter.tps, 3),
            "benchmark_tps": round(self.benchmark_tps, 3),
        }

    @property
    def can_head(self) -> bool:
        return self.shard.start == 0 and self.shard.tokenizer is not None

    def cancel(self, session_id: str) -> bool:
        """Free a session (the node's own decision: end of a generation, a failed step)."""
        self.scheduler.forget(session_id)
        return self.store.drop(session_id)

    def end_session(
        self, session_id: str, headers: Mapping[str, str], *, keep: Sequence[str] | None = None
    ) -> bool:
        """Free a session for a caller presenting its capability; False if there is none.

        ``keep``: the chain of the tokens it ran, to keep its state under in the
        prefix cache (:meth:`end`). Raises 401/403 (``capability_required`` /
        ``capability_invalid``) for anyone else.
        """
        session = self.store.get(session_id)
        if session is None:
            return False
        self.gate.check_capability(headers, session.capability)
        if keep is not None:
            return self.end(session_id, keep)
        return self.cancel(session_id)

    @functools.cached_property
    def grammar_words(self) -> Any:
        """The tokenizer as llguidance reads it, for grammars (built at first use, then cached)."""
        if self.shard.tokenizer is None:
            raise RuntimeRequestError(
                "this node has no tokenizer, so it cannot follow a grammar",
                code="bad_grammar",
            )
        return grammar_words(self.shard.tokenizer)

    async def picker(self, sampling: SamplingParams, generated_ids: Sequence[int]) -> TokenPicker:
        """A new session's token picker on the last hop: with its grammar's constraint,
        compiled on the torch thread (a large schema takes a while), when it has one."""
        if sampling.grammar is None:
            return TokenPicker(sampling, generated_ids)
        grammar = sampling.grammar
        constraint = await self.compute(
            lambda: Constraint(self.grammar_words, grammar, generated_ids)
        )
        return TokenPicker(sampling, generated_ids, constraint)

    async def hop_forward(
        self, session: Session, step: ForwardStep, hidden: torch.Tensor
    ) -> bytes | Choice:
        """A hop's checked step (``hop.step_intake``) through this node's layers.

        Hidden states (or the chosen token, when the step ends the model) out.
        The caller holds the session's lock and has checked the step's
        position; the session's position advances here.
        """
        tail = None
        if step.generated_ids is not None and session.picker is not None:
            raise RuntimeRequestError(
                "generated_ids are for the step that opens the session", code="bad_field"
            )
        if step.end == self.shard.num_layers - 1:
            if session.picker is None:
                if step.sampling is None:  # a session opened by a claim, stepped without it
                    raise RuntimeRequestError(
                        f"the hop ending at the last layer needs {SAMPLING} on the session's "
                        "first step",
                        code="missing_field",
                    )
                session.picker = await self.picker(step.sampling, step.generated_ids or ())
            tail = TailRequest(
                session.picker.sampling,
                logprobs=step.logprobs,
                prompt_ids=step.prompt_ids or (),
                drafts=step.drafts or (),
            )
        self.admission.cover(session, step.position + step.shape[1], step.reserve)
        ids = list(step.token_ids) if step.token_ids is not None else None
        drafts = len(step.drafts or ())
        if drafts:
            session.cache.hold()
        result = await self.scheduler.submit(
            session, tail=tail, hidden=hidden, ids=ids, drafts=drafts
        )
        if drafts:
            linear = session.cache.linear
            session.draft_round = DraftRound(
                step.position,
                step.shape[1],
                hidden=hidden if linear else None,
                ids=ids if linear else None,
            )
        session.position += step.shape[1]
        session.touch()
        return result

    async def head_forward(
        self, session: Session, token_ids: list[int], tail: TailRequest
    ) -> bytes | Choice:
        """The head's layers for ``token_ids``: hidden bytes, or the choice if it ends the model.

        ``tail`` is what the last layer does (used only when this head holds it).
        The caller holds the session's lock and advances its position after.
        Raises :class:`NonFiniteOutput` when this node computed non-finite values.
        """
        last = session.end == self.shard.num_layers - 1
        if last and session.picker is None:
            session.picker = await self.picker(tail.sampling, tail.generated_ids)
        self.admission.cover(session, session.position + len(token_ids))
        drafts = len(tail.drafts)
        if drafts:
            session.cache.hold()
        result = await self.scheduler.submit(
            session, tail=tail if last else None, tokens=token_ids, drafts=drafts
        )
        if drafts:
            linear = session.cache.linear
            session.draft_round = DraftRound(
                session.position, len(token_ids), tokens=token_ids if linear else None
            )
        return result

    async def rewind(self, session: Session, position: int) -> None:
        """Settle ``session``'s draft round: its state cut back to ``position`` (ADR-0028).

        ``position`` is where the session's next step starts: from the round's
        first position (none kept: a hop after this one refused the round) to past
        its last. K/V forgets the rejected positions
        (a length); linear-attention states go back to the round's start and
        recompute the kept positions from the round's input — the same layers
        on the same inputs, so the state is the one decoding them would hold.
        Refuses (``position_mismatch``) any other position. The caller holds
        the session's lock.
        """
        draft = session.draft_round
        session.draft_round = None
        kv = session.cache
        if draft is None or not draft.position <= position <= session.position:
            raise RuntimeRequestError(
                f"session {session.session_id} is at position {session.position}, not {position}",
                code="position_mismatch",
            )
        if position == session.position:
            kv.release()
            return
        if not kv.linear:
            kv.truncate(position)
        else:
            kv.truncate(draft.position)
            if position > draft.position:
                await self.compute(lambda: self._recompute(session, draft, position))
        session.position = position

    def _recompute(self, session: Session, draft: DraftRound, position: int) -> None:
        """On the torch thread: run a draft round's first ``position - draft.position``
        positions again (the kept ones), from the round's start."""
        kept = position - draft.position
        if draft.tokens is not None:
            hidden = self.runner.embed(draft.tokens[:kept])
        else:
            hidden = draft.hidden[:, :kept].to(device=self.shard.device, dtype=self.shard.dtype)
        self.runner.run_layers(
            hidden,
            cache=session.cache,
            start=session.start,
            end=session.end,
            position=draft.position,
            token_ids=(draft.ids or draft.tokens or [])[:kept] or None,
            prefill=False,
        )

    def _corrupt(self, hidden: torch.Tensor) -> torch.Tensor:
        """The hidden states this node outputs, plus noise when the test-only option is set."""
        if not self.corrupt_hidden_states:
            return hidden
        return hidden + torch.randn_like(hidden) * self.corrupt_hidden_states

    def reap_idle(self) -> list[str]:
        reaped = self.store.reap_idle()
        for session_id in reaped:
            self.scheduler.forget(session_id)
        return reaped

    def close(self) -> None:
        self.worker.shutdown(wait=False, cancel_futures=True)
