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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psutil
import torch
from transformers import PretrainedConfig

# The share of the memory free at start (RAM on a CPU node, the GPU's own on
# cuda) that the default KV budget takes: the rest is left for activations,
# the batch's padded K/V copies, the allocator's slack and other processes.
DEFAULT_BUDGET_SHARE = 0.5

# The first allocation of a layer's buffer, in positions: a decode step after a
# short prompt does not reallocate three times in a row.
MIN_CAPACITY = 16


def bytes_per_position(shard: Any, start: int, end: int) -> int:
    """K/V bytes one position takes in layers ``start..end`` of ``shard`` (a LoadedShard).

    2 (K and V) × layers × KV heads × head dim × the dtype's size.
    """
    config: PretrainedConfig = shard.config
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    itemsize = torch.empty((), dtype=shard.dtype).element_size()
    return 2 * (end - start + 1) * heads * head_dim * itemsize


def default_kv_budget(device: torch.device) -> int:
    """Bytes of K/V a node admits sessions for when not told: a share of the memory free now."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        free = psutil.virtual_memory().available
    return int(free * DEFAULT_BUDGET_SHARE)


class SessionKV:
    """One session's K/V for the layers of its range; ``limit`` caps growth (its reservation)."""

    def __init__(self, *, limit: int | None = None) -> None:
        self.limit = limit
        self._keys: dict[int, torch.Tensor] = {}
        self._values: dict[int, torch.Tensor] = {}
        self._lengths: dict[int, int] = {}

    def length(self, layer: int) -> int:
        """Positions held for ``layer`` (0 before its first step)."""
        return self._lengths.get(layer, 0)

    @property
    def nbytes(self) -> int:
        """Bytes the buffers take (capacity, not length)."""
        tensors: Iterable[torch.Tensor] = [*self._keys.values(), *self._values.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

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


class BatchCache:
    """The ``cache=`` of one batched forward: row ``i`` of the batch belongs to ``sessions[i]``."""

    def __init__(self, sessions: Sequence[SessionKV]) -> None:
        self.sessions = list(sessions)

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

        Llama 4's NoPE layers derive the step's positions from it; the batcher
        only batches rows of such a family at the same past, and this checks it.
        """
        lengths = {kv.length(layer_idx) for kv in self.sessions}
        if len(lengths) != 1:
            raise RuntimeError("the rows of this batch do not share their past length")
        return lengths.pop()


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
