"""Admission: whether a step may run here, and the sessions it runs in.

Everything a node checks before it computes: that a step's layers lie in
its shard and its positions in the model's context, that its fields fit the
model (vocabulary, the ids a family's layers take, sampling on the opening
step of the last hop), that it is trusted (a signed plan opens a session, its
capability continues it: ``trust.PlanGate``), that it stays within what its
plan lets the session hold (positions; the plan's request not over: ADR-0002,
"What a plan lets a hop hold"), and that the node has room for it (a session
reserves its K/V and states against the KV budget:
``sessions.SessionStore``). All of it runs on the event loop, on headers and
bookkeeping only; the scheduler and the runner never see a refused step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from nodes_app.protocol.limits import SAMPLING
from nodes_app.runtime.engine.kv import linear_state_bytes, session_bytes
from nodes_app.runtime.engine.runner import ShardRunner
from nodes_app.runtime.engine.sampler import SamplingParams, check_logit_bias
from nodes_app.runtime.engine.sessions import Session, SessionStore
from nodes_app.runtime.engine.trust import Grant, PlanGate
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.loading.shard import LoadedShard
from nodes_app.runtime.wire.entries import ForwardStep

# Positions a session reserves past the end of the step that opens (or
# outgrows) it when nobody said how far it goes (no ``reserve`` on its opening step).
DEFAULT_RESERVE_POSITIONS = 512


class Admission:
    """The checks and session bookkeeping of one node (its shard, sessions and trust gate)."""

    def __init__(
        self,
        shard: LoadedShard,
        *,
        node_id: str,
        store: SessionStore,
        gate: PlanGate,
        runner: ShardRunner,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.shard = shard
        self.node_id = node_id
        self.store = store
        self.gate = gate
        self.runner = runner
        # Plans say when their request is over in unix seconds.
        self.wall_clock = wall_clock

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

    def reservation(
        self, reserve: int | None, *, reached: int = 0, granted: int | None = None
    ) -> int:
        """Positions a session reserves: ``reserve``, else ``reached`` plus a default.

        ``reached`` is the end of its latest step; without ``reserve`` the
        session reserves :data:`DEFAULT_RESERVE_POSITIONS` past it. Never past
        the model's context or what its plan ``granted``, never short of
        ``reached`` (admission refused a step past the grant before).
        """
        wanted = reserve if reserve is not None else reached + DEFAULT_RESERVE_POSITIONS
        ceiling = self.context_length if granted is None else min(granted, self.context_length)
        return max(1, min(max(wanted, reached), ceiling), reached)

    def open_session(
        self,
        session_id: str,
        start: int,
        end: int,
        *,
        capability: bytes | None = None,
        reserve: int | None = None,
        grant: Grant | None = None,
        prefix: bool = False,
    ) -> Session:
        """Admit a session reserving ``reserve`` positions (see :meth:`reservation`), or 503.

        ``grant`` (a signed plan's, see :meth:`admit_step`) bounds what it holds
        and how long; its capability is the session's, unless ``capability`` is given.
        ``prefix``: the session may take and leave prefix cache (ADR-0027), so its
        linear-attention states are snapshotted at block boundaries (reserved too).
        """
        self.check_range(start, end)
        grant = grant or Grant(capability)
        granted = grant.max_positions or None
        positions = self.reservation(reserve, granted=granted)
        cache = self.runner.new_cache(limit=positions)
        if prefix and linear_state_bytes(self.shard, start, end):
            cache.snapshot_block = self.store.prefix.block
        return self.store.create(
            session_id,
            start=start,
            end=end,
            cache=cache,
            reserve=positions,
            reserved_bytes=self._bytes(start, end, positions, snapshots=prefix),
            capability=capability if capability is not None else grant.capability,
            max_positions=granted,
            lifetime=grant.ends_at - self.wall_clock() if grant.ends_at else None,
            idle_limit=grant.idle_seconds or None,
        )

    def _bytes(self, start: int, end: int, positions: int, *, snapshots: bool) -> int:
        """A session's reservation; with ``snapshots``, room for the two linear-attention
        snapshots a prefix-caching session keeps (``SessionKV.ran``)."""
        extra = 2 * linear_state_bytes(self.shard, start, end) if snapshots else 0
        return session_bytes(self.shard, start, end, positions) + extra

    def cover(self, session: Session, reached: int, reserve: int | None = None) -> None:
        """Grow ``session``'s reservation to cover position ``reached`` (never refused:
        :meth:`admit_step` refused a step past its plan's grant)."""
        if reached <= session.reserve and (reserve is None or reserve <= session.reserve):
            return
        positions = self.reservation(reserve, reached=reached, granted=session.max_positions)
        self.store.extend(
            session,
            reserve=positions,
            reserved_bytes=self._bytes(
                session.start,
                session.end,
                positions,
                snapshots=session.cache.snapshot_block is not None,
            ),
        )
        session.cache.limit = session.reserve

    def admit_step(self, step: ForwardStep, headers: Mapping[str, str]) -> Grant:
        """The trust check of a step, on its headers alone; what its credentials grant.

        A step that opens a session needs a signed plan for it that grants the
        positions it asks to reserve or reach (see :class:`PlanGate`); a later
        step needs the session's capability, and may not reach past, or ask to
        reserve more than, what the session's plan granted (403
        ``plan_exceeded``), nor come once the plan's request is over (403
        ``session_expired``).
        """
        reached = step.position + step.shape[1]
        session = self.store.get(step.session_id)
        if session is not None:
            grant = Grant(self.gate.check_capability(headers, session.capability))
            if session.over(self.store.clock()):
                raise RuntimeRequestError(
                    f"session {step.session_id}'s request is over (its plan's end has passed)",
                    code="session_expired",
                    status=403,
                    error_type="permission_error",
                )
            granted = session.max_positions
            if granted is not None and max(reached, step.reserve or 0) > granted:
                raise RuntimeRequestError(
                    f"the step asks for {max(reached, step.reserve or 0)} positions; the "
                    f"session's plan grants {granted}",
                    code="plan_exceeded",
                    status=403,
                    error_type="permission_error",
                )
            return grant
        if step.position != 0:
            # Refused here, before its bytes become a tensor: only a session's
            # opening step may come without one.
            raise RuntimeRequestError(
                f"unknown session {step.session_id} (expired or cancelled?)",
                code="unknown_session",
            )
        return self.gate.admit_session(
            headers,
            node_id=self.node_id,
            session_id=step.session_id,
            start=step.start,
            end=step.end,
            positions=max(reached, step.reserve or 0),
        )

    def admit_claim(
        self, session_id: str, start: int, end: int, reserve: int, headers: Mapping[str, str]
    ) -> Grant:
        """A prefix claim's checks (ADR-0027): it opens a hop session as a first step would."""
        self.check_range(start, end)
        if start == 0:
            raise RuntimeRequestError(
                "layer 0 takes token ids: only the head runs it", code="layers_out_of_range"
            )
        if self.store.get(session_id) is not None:
            raise RuntimeRequestError(
                f"session {session_id} already exists: a claim opens a new session",
                code="session_exists",
            )
        return self.gate.admit_session(
            headers,
            node_id=self.node_id,
            session_id=session_id,
            start=start,
            end=end,
            positions=reserve,
        )

    def check_step(self, step: ForwardStep) -> None:
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
        last = step.end == self.shard.num_layers - 1
        # A session's sampling is fixed when it opens; later steps need not repeat it
        # (a head before this one did: it is then read and ignored).
        if last and step.position == 0 and step.sampling is None:
            raise RuntimeRequestError(
                f"the hop ending at the last layer needs {SAMPLING} on the step "
                "that opens the session",
                code="missing_field",
            )
        tail_fields = (step.logprobs, step.prompt_ids, step.generated_ids)
        if not last and any(value is not None for value in tail_fields):
            raise RuntimeRequestError(
                "logprobs, prompt_ids and generated_ids are for the hop ending at the last layer",
                code="bad_field",
            )
        # An echo scores the prompt from position 0 on; the resumed tokens are counted
        # when the session's picker is made, by its first step (at the position the
        # route's prefix claim agreed on, ADR-0027: ``NodeService.hop_forward`` checks).
        if step.position != 0 and step.prompt_ids is not None:
            raise RuntimeRequestError(
                "prompt_ids are for the step that opens the session", code="bad_field"
            )
        if self.shard.family.per_layer_inputs:
            if step.token_ids is None or len(step.token_ids) != step.shape[1]:
                raise RuntimeRequestError(
                    f"{self.shard.config.model_type} layers take the step's token ids, "
                    "one per position",
                    code="missing_field",
                )
            if max(step.token_ids) >= self.vocab_size:
                raise RuntimeRequestError(
                    f"the step names token ids past the vocabulary (0..{self.vocab_size - 1})",
                    code="bad_field",
                )
        elif step.token_ids is not None:
            raise RuntimeRequestError(
                "token_ids are for families whose layers take them", code="bad_field"
            )
        if step.drafts is not None:
            self._check_drafts(step)
        if step.sampling is not None:
            self.check_vocabulary(
                step.sampling, (*(step.prompt_ids or ()), *(step.generated_ids or ()))
            )

    def _check_drafts(self, step: ForwardStep) -> None:
        """A draft round (ADR-0028): a decode step's, within the vocabulary, matching the
        step's own ids where it carries them."""
        drafts = step.drafts or ()
        if step.position == 0 or step.prompt_ids is not None or step.generated_ids is not None:
            raise RuntimeRequestError(
                "drafts follow a session's first step, never open it", code="bad_field"
            )
        if max(drafts) >= self.vocab_size:
            raise RuntimeRequestError(
                f"the step names token ids past the vocabulary (0..{self.vocab_size - 1})",
                code="bad_field",
            )
        if step.token_ids is not None and step.token_ids[-len(drafts) :] != drafts:
            raise RuntimeRequestError("drafts are the step's last token ids", code="bad_field")

    @property
    def vocab_size(self) -> int:
        return int(self.shard.config.vocab_size)

    def check_vocabulary(self, sampling: SamplingParams, token_ids: Iterable[int] = ()) -> None:
        """Refuse token ids past the vocabulary: logit_bias keys (``bad_sampling``), others."""
        vocab = self.vocab_size
        check_logit_bias(sampling, vocab)
        if any(token >= vocab for token in token_ids):
            raise RuntimeRequestError(
                f"the step names token ids past the vocabulary (0..{vocab - 1})", code="bad_field"
            )

    def session_for(self, step: ForwardStep, grant: Grant | None) -> Session:
        """The session a hop step runs in: opened by its first step, else the one it names.

        ``grant`` is what :meth:`admit_step` returned (None: nothing was
        presented). Refuses an unknown session past position 0, a capability
        other than the session's, and a step of other layers than the session's.
        """
        grant = grant or Grant()
        session = self.store.get(step.session_id)
        if session is None:
            if step.position != 0:
                raise RuntimeRequestError(
                    f"unknown session {step.session_id} (expired or cancelled?)",
                    code="unknown_session",
                )
            session = self.open_session(
                step.session_id,
                step.start,
                step.end,
                grant=grant,
                reserve=self.reservation(
                    step.reserve,
                    reached=step.position + step.shape[1],
                    granted=grant.max_positions or None,
                ),
            )
        elif not session.admits(grant.capability):
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
        return session
