"""Per-session KV storage and the batch cache that transformers' attention layers write through.

Why not ``DynamicCache``: it appends with ``torch.cat`` on every step, copying
the whole past K/V of every layer once per token, and it holds one batch
whose rows share a length. Here each session owns, per layer of its range, a
K and a V buffer that grows by doubling (amortised O(1) appends, never past
its reservation when it can help it) and a length.

A batched forward hands the layers a :class:`BatchCache`: transformers 5's
attention modules call ``cache.update(key, value, layer_idx, kwargs=...)`` on
whatever object is passed as ``cache=``. It appends each row's new K/V to that
row's session and answers K/V for the whole batch: for one session, views of
its buffer (no copy); for several, a copy padded to the batch's longest
context, the padding hidden by the boolean mask :func:`attention_mask` builds
(``sdpa`` is forced at load; a boolean mask's True attends).

Linear-attention layers (Gated DeltaNet, in the hybrid families qwen3_next
and qwen3_5_moe) keep no K/V: per session and layer they keep a convolution
state (the last ``conv_kernel_size`` positions of the mixed q/k/v,
``[1, conv_dim, kernel]``) and a recurrent state (``[1, value_heads,
key_head_dim, value_head_dim]``, float32), both of a fixed size. The layers
reach them through ``get_conv_state`` / ``update_conv_state`` /
``get_recurrent_state`` / ``update_recurrent_state`` on the same
``BatchCache``, with transformers' ``LinearAttentionLayer`` semantics: None
before a session's first step, a later multi-position step (a prefill chunk)
continuing from the kept state. A one-session forward hands the layer the
session's own tensors, so the single-token convolution's in-place update lands
in the session; a batch hands stacked copies and writes every row back to its
session when the layer stores its recurrent state, :meth:`BatchCache.commit`
writing back whatever a layer left.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psutil
import torch
import torch.nn.functional as F
from transformers import PretrainedConfig

from nodes_app.runtime.engine.family_adapters import LINEAR_ATTENTION

# The share of the memory free at start (RAM on a CPU node, the GPU's own on
# cuda) that the default KV budget takes: the rest is left for activations,
# the batch's padded K/V copies, the allocator's slack and other processes.
DEFAULT_BUDGET_SHARE = 0.5

# The first allocation of a layer's buffer, in positions: a decode step after a
# short prompt does not reallocate three times in a row.
MIN_CAPACITY = 16


# Gated DeltaNet computes its recurrent state in float32 whatever the model's dtype.
RECURRENT_STATE_ITEMSIZE = 4


def bytes_per_position(shard: Any, start: int, end: int) -> int:
    """K/V bytes one position takes in layers ``start..end`` of ``shard`` (a LoadedShard).

    Per layer keeping K/V (linear-attention layers keep none): KV heads × (key
    head dim + value head dim) × the dtype's size, each layer's dimensions as
    its family declares them (``Family.kv_dims``).
    """
    itemsize = torch.empty((), dtype=shard.dtype).element_size()
    total = 0
    for index in range(start, end + 1):
        if shard.layer_types[index] == LINEAR_ATTENTION:
            continue
        heads, key_dim, value_dim = shard.family.kv_dims(shard.config, index)
        total += heads * (key_dim + value_dim) * itemsize
    return total


def linear_state_bytes(shard: Any, start: int, end: int) -> int:
    """Fixed bytes one session's linear-attention states take in layers ``start..end``.

    Per linear layer: the convolution state, conv_dim (2 × key heads × key head
    dim + value heads × value head dim) × kernel × the dtype's size, and the
    float32 recurrent state, value heads × key head dim × value head dim × 4.
    0 for a range without linear-attention layers.
    """
    config: PretrainedConfig = shard.config
    # The layer types as the shard's family reads them (the same the runner masks by).
    layers = shard.layer_types[start : end + 1].count(LINEAR_ATTENTION)
    if not layers:
        return 0
    key_heads, key_dim = int(config.linear_num_key_heads), int(config.linear_key_head_dim)
    value_heads, value_dim = int(config.linear_num_value_heads), int(config.linear_value_head_dim)
    conv_dim = 2 * key_heads * key_dim + value_heads * value_dim
    itemsize = torch.empty((), dtype=shard.dtype).element_size()
    conv = conv_dim * int(config.linear_conv_kernel_dim) * itemsize
    recurrent = value_heads * key_dim * value_dim * RECURRENT_STATE_ITEMSIZE
    return layers * (conv + recurrent)


def session_bytes(shard: Any, start: int, end: int, positions: int) -> int:
    """A session's reservation: its K/V up to ``positions`` plus its fixed linear states."""
    return positions * bytes_per_position(shard, start, end) + linear_state_bytes(shard, start, end)


def default_kv_budget(device: torch.device) -> int:
    """Bytes of K/V a node admits sessions for when not told: a share of the memory free now."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        free = psutil.virtual_memory().available
    return int(free * DEFAULT_BUDGET_SHARE)


# A linear-attention snapshot: each layer's convolution state and recurrent state.
Snapshot = tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]


class SessionKV:
    """One session's state for the layers of its range; ``limit`` caps K/V growth (its reservation).

    Attention layers keep K/V that grows with the positions; linear-attention
    layers keep a convolution state and a recurrent state of a fixed size.
    """

    def __init__(self, *, limit: int | None = None) -> None:
        self.limit = limit
        self._keys: dict[int, torch.Tensor] = {}
        self._values: dict[int, torch.Tensor] = {}
        self._lengths: dict[int, int] = {}
        self._conv: dict[int, torch.Tensor] = {}
        self._recurrent: dict[int, torch.Tensor] = {}
        # Positions every layer has run (the runner says so after each forward).
        self.reached = 0
        # Prefix reuse (engine.prefix_cache): with ``snapshot_block`` set, the
        # linear-attention states are copied whenever a forward ends on a multiple
        # of it: the last such position of a prefill and the latest of all are kept,
        # the only earlier positions this session's states can be truncated to.
        self.snapshot_block: int | None = None
        self._snapshots: dict[int, Snapshot] = {}
        self._prefill_snapshot = 0
        # Speculative decoding (ADR-0028): the linear states where the running draft
        # round began, the position its rejected drafts are cut back to (:meth:`hold`).
        self._held: tuple[int, Snapshot] | None = None

    @property
    def linear(self) -> bool:
        """Whether it holds linear-attention states (resumable only where snapshotted)."""
        return bool(self._conv or self._recurrent)

    def ran(self, position: int, *, prefill: bool) -> None:
        """Every layer has run up to ``position``; snapshot linear states on a block boundary."""
        self.reached = position
        block = self.snapshot_block
        if not block or not self.linear or position % block:
            return
        self._snapshots[position] = self._copy(self._conv, self._recurrent)
        if prefill:
            self._prefill_snapshot = position
        keep = {position, self._prefill_snapshot}
        for kept in [p for p in self._snapshots if p not in keep]:
            del self._snapshots[kept]

    def hold(self) -> None:
        """A draft round begins here: keep the linear states of this position until the
        next :meth:`truncate` or :meth:`release` (nothing to keep without linear layers).

        K/V needs no copy: a truncate is a length. A linear state is a summary of
        every position, so the round's start is the one earlier state it can go back to.
        """
        if self.linear:
            self._held = (self.reached, self._copy(self._conv, self._recurrent))

    def release(self) -> None:
        """The draft round is settled without a rollback: drop what :meth:`hold` kept."""
        self._held = None

    def resumable(self, positions: int) -> bool:
        """Whether the state can be cut back to ``positions`` (see :meth:`truncate`)."""
        if positions > self.reached:
            return False
        held = self._held is not None and self._held[0] == positions
        return (
            positions in (0, self.reached)
            or not self.linear
            or positions in self._snapshots
            or held
        )

    @property
    def snapshots(self) -> tuple[int, ...]:
        """The earlier positions its linear states were kept at (none without linear layers)."""
        return tuple(sorted(self._snapshots))

    def truncate(self, positions: int) -> None:
        """Cut the state back to its first ``positions``: speculation's rollback, a claim's
        settling (ADR-0027). K/V keeps its buffers and forgets the rest; linear states
        go back to a snapshot, or to where a draft round began (:meth:`hold`). ValueError
        where :meth:`resumable` says no."""
        if not self.resumable(positions):
            raise ValueError(f"no state to resume at position {positions}")
        for layer, length in self._lengths.items():
            self._lengths[layer] = min(length, positions)
        if positions == 0:
            self._conv.clear()
            self._recurrent.clear()
        elif positions != self.reached and self.linear:
            if positions in self._snapshots:
                self._conv, self._recurrent = self._copy(*self._snapshots[positions])
            else:
                assert self._held is not None  # resumable: the draft round's start
                self._conv, self._recurrent = self._held[1]  # dropped below: no copy
        self._snapshots = {p: s for p, s in self._snapshots.items() if p <= positions}
        self._held = None
        self.reached = positions

    def adopt_prefix(self, source: SessionKV, positions: int) -> None:
        """Copy ``source``'s first ``positions`` (resumable there) into this empty state."""
        if not source.resumable(positions):
            raise ValueError(f"the source holds no state to resume at position {positions}")
        for layer, length in source._lengths.items():
            keys, values = source._keys[layer], source._values[layer]
            count = min(length, positions)
            capacity = max(count, MIN_CAPACITY)
            if self.limit is not None:
                capacity = min(max(capacity, count), max(count, self.limit))
            own_keys = keys.new_zeros((1, keys.shape[1], capacity, keys.shape[3]))
            own_values = values.new_zeros((1, values.shape[1], capacity, values.shape[3]))
            own_keys[:, :, :count] = keys[:, :, :count]
            own_values[:, :, :count] = values[:, :, :count]
            self._keys[layer], self._values[layer] = own_keys, own_values
            self._lengths[layer] = count
        if source.linear and positions:
            if positions == source.reached:
                conv, recurrent = source._conv, source._recurrent
            else:
                conv, recurrent = source._snapshots[positions]
            self._conv, self._recurrent = self._copy(conv, recurrent)
        self.reached = positions
        if self.snapshot_block and self.linear:
            # Where it started is where the next session sharing this prefix resumes.
            self.ran(positions, prefill=True)

    @staticmethod
    def _copy(conv: dict[int, torch.Tensor], recurrent: dict[int, torch.Tensor]) -> Snapshot:
        """A copy of linear states, each layer's own tensors."""
        return (
            {layer: state.clone() for layer, state in conv.items()},
            {layer: state.clone() for layer, state in recurrent.items()},
        )

    def length(self, layer: int) -> int:
        """Positions held for ``layer`` (0 before its first step)."""
        return self._lengths.get(layer, 0)

    @property
    def nbytes(self) -> int:
        """Bytes the buffers take (K/V capacity, not length, and the linear-attention states)."""
        copies = [*self._snapshots.values(), *([self._held[1]] if self._held else [])]
        tensors: Iterable[torch.Tensor] = [
            *self._keys.values(),
            *self._values.values(),
            *self._conv.values(),
            *self._recurrent.values(),
            *(t for conv, rec in copies for t in (*conv.values(), *rec.values())),
        ]
        return sum(t.numel() * t.element_size() for t in tensors)

    def conv_state(self, layer: int) -> torch.Tensor | None:
        """``layer``'s convolution state ``[1, conv_dim, kernel]``; None before its first step.

        The session's own tensor: an in-place update of it is the session's new state.
        """
        return self._conv.get(layer)

    def recurrent_state(self, layer: int) -> torch.Tensor | None:
        """``layer``'s recurrent state ``[1, value_heads, key_dim, value_dim]``; None before."""
        return self._recurrent.get(layer)

    def keep_conv_state(self, layer: int, state: torch.Tensor) -> None:
        """Make ``state`` (``[1, conv_dim, kernel]``) ``layer``'s convolution state."""
        self._conv[layer] = _owned(state)

    def keep_recurrent_state(self, layer: int, state: torch.Tensor) -> None:
        """Make ``state`` (``[1, value_heads, key_dim, value_dim]``) ``layer``'s recurrent state."""
        self._recurrent[layer] = _owned(state)

    def append(
        self, layer: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key``/``value`` (``[1, kv_heads, q, head_dim]``); views of the whole past."""
        length = self.length(layer)
        needed = length + key.shape[2]
        keys, values = self._keys.get(layer), self._values.get(layer)
        if keys is None or values is None or keys.shape[2] < needed:
            keys, values = self._grow(layer, key, value, needed)
        keys[:, :, length:needed] = key
        values[:, :, length:needed] = value
        self._lengths[layer] = needed
        return keys[:, :, :needed], values[:, :, :needed]

    def _grow(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, needed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        old_keys, old_values = self._keys.get(layer), self._values.get(layer)
        capacity = max(needed, MIN_CAPACITY, 2 * (old_keys.shape[2] if old_keys is not None else 0))
        if self.limit is not None:
            # Doubling past the reservation would hold memory admission never counted.
            capacity = min(capacity, max(needed, self.limit))
        keys = key.new_zeros((1, key.shape[1], capacity, key.shape[3]))
        values = value.new_zeros((1, value.shape[1], capacity, value.shape[3]))
        length = self.length(layer)
        if old_keys is not None and old_values is not None and length:
            keys[:, :, :length] = old_keys[:, :, :length]
            values[:, :, :length] = old_values[:, :, :length]
        self._keys[layer], self._values[layer] = keys, values
        return keys, values


def _owned(state: torch.Tensor) -> torch.Tensor:
    """``state`` itself when it is the whole of its storage, else a compact copy.

    A row of a batch's tensor, or the tail of a prefill's, would otherwise keep
    the whole of it alive for as long as the session lives.
    """
    whole = state.untyped_storage().nbytes() == state.numel() * state.element_size()
    if whole and state.is_contiguous():
        return state
    return state.clone(memory_format=torch.contiguous_format)


def _stacked(states: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """The rows' states as one batch; zeros for a row without one yet (None when no row has one).

    Zeros are exact for a row's first step: the causal convolution pads its
    left with zeros, and the delta rule starts from a zero state.
    """
    known = next((state for state in states if state is not None), None)
    if known is None:
        return None
    return torch.cat([state if state is not None else torch.zeros_like(known) for state in states])


class BatchCache:
    """The ``cache=`` of one batched forward: row ``i`` of the batch belongs to ``sessions[i]``.

    The runner calls :meth:`commit` once the layers have run: a batch's
    linear-attention states reach the sessions only through it or through
    ``update_recurrent_state``.
    """

    def __init__(self, sessions: Sequence[SessionKV]) -> None:
        self.sessions = list(sessions)
        # Per linear-attention layer of a batched forward: the stacked
        # convolution state handed out, which the single-token convolution
        # updates in place; written back to the rows' sessions afterwards.
        self._handed_conv: dict[int, torch.Tensor] = {}

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new K/V; answer K/V of each row's whole context, padded to the longest."""
        if len(self.sessions) == 1:
            return self.sessions[0].append(layer_idx, key_states, value_states)
        rows = [
            kv.append(layer_idx, key_states[i : i + 1], value_states[i : i + 1])
            for i, kv in enumerate(self.sessions)
        ]
        longest = max(keys.shape[2] for keys, _ in rows)
        batch, heads, _, dim = key_states.shape
        keys = key_states.new_zeros((batch, heads, longest, dim))
        values = value_states.new_zeros((batch, heads, longest, value_states.shape[3]))
        for i, (row_keys, row_values) in enumerate(rows):
            keys[i, :, : row_keys.shape[2]] = row_keys[0]
            values[i, :, : row_values.shape[2]] = row_values[0]
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions ``layer_idx`` held before this step, the same for every row (Llama 4 asks).

        Llama 4's NoPE layers derive the step's positions from it; the scheduler
        only batches rows of such a family at the same past, and this checks it.
        """
        lengths = {kv.length(layer_idx) for kv in self.sessions}
        if len(lengths) != 1:
            raise RuntimeError("the rows of this batch do not share their past length")
        return lengths.pop()

    def is_recording_past(self, layer_idx: int) -> bool:
        """Never: the states keep only what the next step needs (no rollback)."""
        return False

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        """``[N, conv_dim, kernel]``: the rows' convolution states; None when no row has one yet.

        One session: its own tensor. A batch: a stacked copy, written back by
        ``update_recurrent_state`` or :meth:`commit` (a single-token step
        updates it in place).
        """
        if len(self.sessions) == 1:
            return self.sessions[0].conv_state(layer_idx)
        stacked = _stacked([kv.conv_state(layer_idx) for kv in self.sessions])
        if stacked is not None:
            self._handed_conv[layer_idx] = stacked
        return stacked

    def update_conv_state(
        self,
        conv_states: torch.Tensor,
        layer_idx: int,
        state_idx: int = 0,
        *,
        conv_kernel_size: int,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Keep each row's last ``conv_kernel_size`` positions; answer what the convolution needs.

        ``conv_states`` (``[N, conv_dim, q]``) are the step's new positions.
        The answer is the rows' kept states followed by them (a continuing
        prefill chunk sees its left context), or, on a row's first step, them
        alone, padded on the left with zeros to the kernel's length.
        """
        self._handed_conv.pop(layer_idx, None)
        if len(self.sessions) == 1:
            kept = self.sessions[0].conv_state(layer_idx)
        else:
            kept = _stacked([kv.conv_state(layer_idx) for kv in self.sessions])
        if kept is not None:
            full = torch.cat([kept.to(conv_states.dtype), conv_states], dim=-1)
        elif conv_states.shape[-1] < conv_kernel_size:
            full = F.pad(conv_states, (conv_kernel_size - conv_states.shape[-1], 0))
        else:
            full = conv_states
        for i, kv in enumerate(self.sessions):
            kv.keep_conv_state(layer_idx, full[i : i + 1, :, -conv_kernel_size:])
        return full

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        """``[N, value_heads, key_dim, value_dim]``, the rows' recurrent states; None before any."""
        if len(self.sessions) == 1:
            return self.sessions[0].recurrent_state(layer_idx)
        return _stacked([kv.recurrent_state(layer_idx) for kv in self.sessions])

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """Keep each row's new recurrent state; also writes back the layer's handed-out conv state.

        A Gated DeltaNet layer calls this last, after its convolution ran.
        """
        for i, kv in enumerate(self.sessions):
            kv.keep_recurrent_state(layer_idx, recurrent_states[i : i + 1])
        self._write_back_conv(layer_idx)
        return recurrent_states

    def commit(self) -> None:
        """Write every stacked convolution state still handed out back to its rows' sessions.

        Call once the forward's layers have run. Idempotent; nothing to do
        for one session (its own tensors were updated).
        """
        for layer_idx in list(self._handed_conv):
            self._write_back_conv(layer_idx)

    def _write_back_conv(self, layer_idx: int) -> None:
        stacked = self._handed_conv.pop(layer_idx, None)
        if stacked is None:
            return
        for i, kv in enumerate(self.sessions):
            kv.keep_conv_state(layer_idx, stacked[i : i + 1])


def attention_mask(
    pasts: Sequence[int],
    length: int,
    *,
    window: int | None = None,
    chunk: int | None = None,
    device: torch.device,
    explicit: bool = False,
) -> torch.Tensor | None:
    """The boolean mask ``[N, 1, length, L]`` of a batch whose row ``i`` has ``pasts[i]`` before.

    Row ``i``'s queries sit at ``pasts[i] .. pasts[i] + length - 1`` and its
    keys at ``0 .. pasts[i] + length - 1``; ``L`` is the longest row. A query
    attends keys at or before it (causal, which also hides the padding); on a
    sliding-window layer only the last ``window`` of them (transformers' rule:
    ``key > query - window``); on a chunked layer only those in its own chunk
    of ``chunk`` positions (``key // chunk == query // chunk``). ``None`` when
    ``sdpa`` needs no mask and ``explicit`` is not asked: one row, no window
    or chunk boundary reached, and either one query (it sees everything) or
    no past (``sdpa``'s own ``is_causal`` applies; with a past it would not).
    """
    longest = max(pasts) + length
    bounded = (window is not None and longest > window) or (chunk is not None and longest > chunk)
    if not explicit and len(pasts) == 1 and not bounded and (length == 1 or pasts[0] == 0):
        return None
    queries = torch.tensor(pasts, device=device).unsqueeze(1) + torch.arange(length, device=device)
    keys = torch.arange(longest, device=device).view(1, 1, -1)
    queries = queries.unsqueeze(2)
    allowed = keys <= queries
    if window is not None:
        allowed &= keys > queries - window
    if chunk is not None:
        allowed &= torch.div(keys, chunk, rounding_mode="floor") == torch.div(
            queries, chunk, rounding_mode="floor"
        )
    return allowed.unsqueeze(1)
