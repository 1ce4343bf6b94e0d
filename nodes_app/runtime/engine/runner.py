"""Run a range of decoder layers for a batch of sessions, through transformers' layer classes.

Each session owns a :class:`~nodes_app.runtime.engine.kv.SessionKV` holding this
node's layers only: attention modules index the cache by their global layer
number, so a session of layers 15-29 simply never touches 0-14. Positions are
explicit per row, so a hop that starts at layer 22 of a node whose shard
starts at 0 runs correctly, and rows of different context lengths share one
forward: :func:`~nodes_app.runtime.engine.kv.attention_mask` hides what a row must
not see.

Everything a model family does differently (embedding scale, rotary per
layer type, eager attention's additive mask, logit scaling and softcapping)
is declared by its :class:`~nodes_app.runtime.engine.family_adapters.Family`; the runner
only asks it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nodes_app.runtime.engine.family_adapters import LINEAR_LAYER_TYPES
from nodes_app.runtime.engine.kv import BatchCache, SessionKV, attention_mask
from nodes_app.runtime.loading.shard import LoadedShard


class ShardRunner:
    """Stateless compute over a :class:`LoadedShard`; sessions own their K/V."""

    def __init__(self, shard: LoadedShard) -> None:
        self.shard = shard
        self.config = shard.config
        self.family = shard.family
        window = getattr(self.config, "sliding_window", None)
        self.sliding_window: int | None = int(window) if window else None
        chunk = getattr(self.config, "attention_chunk_size", None)
        self.attention_chunk: int | None = int(chunk) if chunk else None

    def new_cache(self, *, limit: int | None = None) -> SessionKV:
        """An empty K/V store for one session; ``limit`` (positions) caps its buffers' growth."""
        return SessionKV(limit=limit)

    @torch.inference_mode()
    def embed(self, token_ids: list[int]) -> torch.Tensor:
        """``[1, len(token_ids), hidden]`` input embeddings (the head's shard only)."""
        if self.shard.embed is None:
            raise RuntimeError("this shard does not start at layer 0: it holds no embeddings")
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.shard.device)
        return self.family.embed(self.shard.embed, self.config, ids)

    @torch.inference_mode()
    def run_layers(
        self,
        hidden: torch.Tensor,
        *,
        cache: SessionKV,
        start: int,
        end: int,
        position: int,
        token_ids: Sequence[int] | None = None,
        prefill: bool | None = None,
    ) -> torch.Tensor:
        """One session's hidden states after layers ``start..end`` at positions ``position…``."""
        return self.run_batch(
            hidden,
            caches=[cache],
            pasts=[position],
            start=start,
            end=end,
            token_ids=None if token_ids is None else [token_ids],
            prefill=prefill,
        )

    @torch.inference_mode()
    def run_batch(
        self,
        hidden: torch.Tensor,
        *,
        caches: Sequence[SessionKV],
        pasts: Sequence[int],
        start: int,
        end: int,
        token_ids: Sequence[Sequence[int]] | None = None,
        prefill: bool | None = None,
    ) -> torch.Tensor:
        """Hidden states ``[N, q, H]`` after layers ``start..end``; row ``i`` fills ``caches[i]``.

        Row ``i`` holds ``q`` new positions from ``pasts[i]`` on (its cache
        already holds ``pasts[i]``). Rows are independent: one row's values
        never reach another's output. ``token_ids`` (row ``i``'s ``q`` ids)
        are needed by families whose layers take per-layer embeddings.
        ``prefill`` says whether the positions are a prompt's (where a prefix
        snapshot is kept, ``SessionKV.ran``): by default when ``q`` > 1; a draft
        round's several positions are decode.
        """
        length = hidden.shape[1]
        device = hidden.device
        position_ids = torch.tensor(list(pasts), device=device, dtype=torch.long).unsqueeze(
            1
        ) + torch.arange(length, device=device, dtype=torch.long)
        kinds = [self.shard.layer_types[index] for index in range(start, end + 1)]
        masks = {kind: self._mask(kind, pasts, length, hidden) for kind in set(kinds)}
        position_embeddings = self.family.position_embeddings(
            self.shard.rotary, hidden, position_ids, set(kinds)
        )
        per_layer = self._per_layer(token_ids, device)
        cache = BatchCache(caches)
        for index, kind in zip(range(start, end + 1), kinds, strict=True):
            # Gemma 4's layers also take their per-layer input and the K/V other layers
            # share; a served config shares none (nodes_app.shared.families refuses it).
            inputs = (
                {}
                if per_layer is None
                else {"per_layer_input": per_layer[:, :, index], "shared_kv_states": {}}
            )
            hidden = self.shard.layers[index](
                hidden,
                **inputs,
                attention_mask=masks[kind],
                position_embeddings=position_embeddings[kind],
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
            )
        cache.commit()
        for kv, past in zip(caches, pasts, strict=True):
            kv.ran(past + length, prefill=length > 1 if prefill is None else prefill)
        return hidden

    def _per_layer(
        self, token_ids: Sequence[Sequence[int]] | None, device: torch.device
    ) -> torch.Tensor | None:
        """Each row's per-layer embeddings ``[N, q, layers, P]``, for a family that takes them."""
        if not self.family.per_layer_inputs:
            return None
        if token_ids is None:
            raise RuntimeError(f"{self.config.model_type} layers need the step's token ids")
        ids = torch.tensor([list(row) for row in token_ids], dtype=torch.long, device=device)
        return self.family.per_layer_embeddings(self.shard.decoder, ids)

    def _mask(
        self, kind: str, pasts: Sequence[int], length: int, hidden: torch.Tensor
    ) -> torch.Tensor | None:
        """The mask a layer of type ``kind`` takes: boolean for ``sdpa``, additive for ``eager``."""
        if kind in LINEAR_LAYER_TYPES:
            return None  # a recurrent state has no keys to hide; rows are never padded
        eager = self.family.attention == "eager"
        allowed = attention_mask(
            pasts,
            length,
            window=self.sliding_window if kind == "sliding_attention" else None,
            chunk=self.attention_chunk if kind == "chunked_attention" else None,
            device=hidden.device,
            # eager attention has no is_causal of its own: it needs every mask spelled out
            explicit=eager and length > 1,
        )
        if allowed is None or not eager:
            return allowed
        blocked = torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device)
        return blocked.masked_fill_(~allowed, torch.finfo(hidden.dtype).min)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (float32, ``[N, q, vocab]``) at every position: final norm + LM head (an echo)."""
        if self.shard.norm is None or self.shard.lm_head is None:
            raise RuntimeError("this shard does not end at the last layer: it holds no LM head")
        logits = self.shard.lm_head(self.shard.norm(hidden)).float()
        return self.family.finish(self.config, logits)

    @torch.inference_mode()
    def last_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (float32, ``[N, vocab]``) for each row's last position: final norm + LM head."""
        return self.logits(hidden[:, -1:, :])[:, -1]
