"""A node's serving state: the shard, its sessions, and the one thread that runs torch.

All torch work goes through :meth:`NodeService.compute`, a single worker
thread, so the event loop stays responsive (health checks, cancels) while a
step runs, and torch sees one caller. Session bookkeeping happens on the
event loop only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from nodes_app import protocol
from nodes_app.runtime import wire
from nodes_app.runtime.errors import NonFiniteOutput, RuntimeRequestError
from nodes_app.runtime.loading import LoadedShard
from nodes_app.runtime.sampling import SamplingParams, new_generator, sample_token
from nodes_app.runtime.sessions import IDLE_TIMEOUT_SECONDS, Session, SessionStore
from nodes_app.runtime.shard import ShardExecutor
from nodes_app.runtime.trust import PlanGate

T = TypeVar("T")


class ThroughputMeter:
    """Exponentially weighted tokens/s of single-token (decode) steps."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.tps = 0.0

    def record(self, tokens: int, seconds: float) -> None:
        if tokens != 1 or seconds <= 0:
            return
        sample = 1.0 / seconds
        self.tps = sample if self.tps == 0 else self.alpha * sample + (1 - self.alpha) * self.tps


def _finite(hidden: torch.Tensor) -> torch.Tensor:
    """``hidden``, unless this node computed NaN or infinite values: never pass them on."""
    if not wire.is_finite(hidden):
        raise NonFiniteOutput("the hidden states this node computed are not finite")
    return hidden


class NodeService:
    def __init__(
        self,
        shard: LoadedShard,
        *,
        node_id: str,
        max_sessions: int = 8,
        idle_timeout: float = IDLE_TIMEOUT_SECONDS,
        benchmark_tps: float = 0.0,
        corrupt_hidden_states: float = 0.0,
        gate: PlanGate | None = None,
        max_request_bytes: int = protocol.GENERATE_MAX_BYTES,
        max_prompt_chars: int = protocol.GENERATE_MAX_PROMPT_CHARS,
        step_timeout: float = protocol.STEP_TIMEOUT_SECONDS,
    ) -> None:
        self.shard = shard
        self.node_id = node_id
        # Closed unless given: no pinned tracker key, not dev-open.
        self.gate = gate or PlanGate()
        self.executor = ShardExecutor(shard)
        self.store = SessionStore(max_sessions=max_sessions, idle_timeout=idle_timeout)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshnet-torch")
        self.dtype_name = wire.DTYPE_NAMES[shard.dtype]
        self.queued = 0
        self.streams = 0
        self.meter = ThroughputMeter()
        self.benchmark_tps = benchmark_tps
        # What a head reads of a generate request before it tokenises anything.
        self.max_request_bytes = max_request_bytes
        self.max_prompt_chars = max_prompt_chars
        # What a downstream hop has to answer one step this node sends it
        # (protocol.step_time_limit); past it the hop is reported hung.
        self.step_timeout = step_timeout
        # TEST ONLY (``runnode --corrupt-hidden-states``): a node that silently
        # computes wrong, which the tracker's route probe must catch.
        self.corrupt_hidden_states = corrupt_hidden_states

    async def compute(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the torch thread; ``queued`` counts waiting and running jobs."""
        self.queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.worker, work)
        finally:
            self.queued -= 1

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
            "measured_tps": round(self.meter.tps, 3),
            "benchmark_tps": round(self.benchmark_tps, 3),
        }

    @property
    def can_head(self) -> bool:
        return self.shard.start == 0 and self.shard.tokenizer is not None

    def check_range(self, start: int, end: int) -> None:
        if not (self.shard.start <= start <= end <= self.shard.end):
            raise RuntimeRequestError(
                f"layers {start}-{end} are outside this node's shard "
                f"{self.shard.start}-{self.shard.end}",
                code="layers_out_of_range",
            )

    @property
    def context_length(self) -> int:
        """Positions the model was built for; nothing past them is computed."""
        return int(getattr(self.shard.config, "max_position_embeddings", 0) or 2**31)

    def check_context(self, position: int, length: int) -> None:
        """Refuse steps that would run past the model's context length."""
        if position + length > self.context_length:
            raise RuntimeRequestError(
                f"positions {position}..{position + length - 1} exceed the model's "
                f"context of {self.context_length} tokens",
                code="context_length_exceeded",
            )

    def open_session(
        self, session_id: str, start: int, end: int, *, capability: bytes | None = None
    ) -> Session:
        self.check_range(start, end)
        return self.store.create(
            session_id,
            start=start,
            end=end,
            cache=self.executor.new_cache(),
            capability=capability,
        )

    def cancel(self, session_id: str) -> bool:
        """Free a session (the node's own decision: end of a generation, a failed step)."""
        return self.store.drop(session_id)

    def end_session(self, session_id: str, headers: Mapping[str, str]) -> bool:
        """Free a session for a caller presenting its capability; False if there is none.

        Raises 401/403 (``capability_required`` / ``capability_invalid``) for
        anyone else.
        """
        session = self.store.get(session_id)
        if session is None:
            return False
        self.gate.check_capability(headers, session.capability)
        return self.store.drop(session_id)

    def admit_step(self, step: wire.ForwardStep, headers: Mapping[str, str]) -> bytes | None:
        """The trust check of a step, on its headers alone; the capability hash it presents.

        A step that opens a session needs a signed plan for it (see
        :class:`PlanGate`); a later step needs the session's capability.
        """
        session = self.store.get(step.session_id)
        if session is not None:
            return self.gate.check_capability(headers, session.capability)
        if step.position != 0:
            return None  # refused as unknown_session by forward()
        return self.gate.admit_session(
            headers,
            node_id=self.node_id,
            session_id=step.session_id,
            start=step.start,
            end=step.end,
        )

    def check_step(self, step: wire.ForwardStep) -> None:
        """Everything about a step its headers alone can refuse, before its body is read."""
        self.check_range(step.start, step.end)
        if step.start == 0:
            raise RuntimeRequestError(
                "layer 0 takes token ids: only the head runs it", code="layers_out_of_range"
            )
        self.check_context(step.position, step.shape[1])
        # Any float dtype of the wire is accepted and cast on arrival: a GPU
        # head in float16 may hand over to a CPU node computing in float32.
        if step.shape[2] != self.shard.hidden_size:
            raise RuntimeRequestError(
                f"hidden size is {self.shard.hidden_size}, not {step.shape[2]}", code="bad_shape"
            )
        if step.end == self.shard.num_layers - 1 and step.sampling is None:
            raise RuntimeRequestError(
                f"the hop ending at the last layer needs {protocol.SAMPLING}", code="missing_header"
            )

    async def forward(
        self, step: wire.ForwardStep, body: bytes, capability: bytes | None = None
    ) -> bytes | int:
        """One hop step: hidden states in, hidden states (or the sampled token) out.

        ``capability`` is what :meth:`admit_step` returned for the step: a
        new session keeps it, an existing one must hold the same.
        """
        self.check_step(step)
        last = step.end == self.shard.num_layers - 1
        hidden = wire.tensor_from_bytes(body, step.dtype, step.shape)
        if not wire.is_finite(hidden):
            # The requester relays another node's output: name that node, so the
            # head blames the producer, not this hop and not the client.
            sender = f"from {step.sender} " if step.sender else ""
            raise RuntimeRequestError(
                f"the hidden states sent {sender}hold NaN or infinite values",
                code="non_finite_input",
            )
        session = self.store.get(step.session_id)
        if session is None:
            if step.position != 0:
                raise RuntimeRequestError(
                    f"unknown session {step.session_id} (expired or cancelled?)",
                    code="unknown_session",
                )
            session = self.open_session(
                step.session_id, step.start, step.end, capability=capability
            )
        elif not session.admits(capability):
            raise RuntimeRequestError(
                "wrong capability for this session",
                code="capability_invalid",
                status=403,
                error_type="permission_error",
            )
        if (session.start, session.end) != (step.start, step.end):
            raise RuntimeRequestError(
                f"session {step.session_id} runs layers {session.start}-{session.end}",
                code="layers_changed",
            )
        async with session.lock:
            if step.position != session.position:
                raise RuntimeRequestError(
                    f"session {step.session_id} is at position {session.position}, "
                    f"not {step.position}",
                    code="position_mismatch",
                )
            if last and session.generator is None:
                assert step.sampling is not None
                session.generator = new_generator(step.sampling.seed)
            result = await self.compute(lambda: self._run_step(session, hidden, step.sampling))
            session.position += step.shape[1]
            session.touch()
            return result

    def _run_step(
        self, session: Session, hidden: torch.Tensor, sampling: SamplingParams | None
    ) -> bytes | int:
        began = time.perf_counter()
        hidden = hidden.to(device=self.shard.device, dtype=self.shard.dtype)
        out = self._corrupt(
            self.executor.run_layers(
                hidden,
                cache=session.cache,
                start=session.start,
                end=session.end,
                position=session.position,
            )
        )
        result: bytes | int
        if session.end == self.shard.num_layers - 1:
            assert sampling is not None
            result = sample_token(self.executor.last_logits(out), sampling, session.generator)
        else:
            result = wire.tensor_to_bytes(_finite(out))
        self.meter.record(hidden.shape[1], time.perf_counter() - began)
        return result

    def head_step(
        self, session: Session, token_ids: list[int], sampling: SamplingParams
    ) -> bytes | int:
        """The head's layers for ``token_ids``: hidden bytes, or a token if it ends the model."""
        began = time.perf_counter()
        hidden = self._corrupt(
            self.executor.run_layers(
                self.executor.embed(token_ids),
                cache=session.cache,
                start=0,
                end=session.end,
                position=session.position,
            )
        )
        result: bytes | int
        if session.end == self.shard.num_layers - 1:
            if session.generator is None:
                session.generator = new_generator(sampling.seed)
            result = sample_token(self.executor.last_logits(hidden), sampling, session.generator)
        else:
            result = wire.tensor_to_bytes(_finite(hidden))
        self.meter.record(len(token_ids), time.perf_counter() - began)
        return result

    def _corrupt(self, hidden: torch.Tensor) -> torch.Tensor:
        """The hidden states this node outputs, plus noise when the test-only option is set."""
        if not self.corrupt_hidden_states:
            return hidden
        return hidden + torch.randn_like(hidden) * self.corrupt_hidden_states

    def reap_idle(self) -> list[str]:
        return self.store.reap_idle()

    def close(self) -> None:
        self.worker.shutdown(wait=False, cancel_futures=True)
