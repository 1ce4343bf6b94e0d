"""Run a range of decoder layers for a batch of sessions, through transformers' layer classes.

Each session owns a :class:`~nodes_app.runtime.kv.SessionKV` holding this
node's layers only: attention modules index the cache by their global layer
number, so a session of layers 15-29 simply never touches 0-14. Positions are
explicit per row, so a hop that starts at layer 22 of a node whose shard
starts at 0 runs correctly, and rows of different context lengths share one
forward: :func:`~nodes_app.runtime.kv.attention_mask` hides what a row must
not see.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nodes_app.runtime.kv import BatchCache, SessionKV, attention_mask
from nodes_app.runtime.loading import LoadedShard


class ShardExecutor:
    """Stateless compute over a :class:`LoadedShard`; sessions own their K/V."""

    def __init__(self, shard: LoadedShard) -> None:
        self.shard = shard
        self.config = shard.config
        window = getattr(self.config, "sliding_window", None)
        self.sliding_window: int | None = int(window) if window else None

    def new_cache(self, *, limit: int | None = None) -> SessionKV:
        """An empty K/V store for one session; ``limit`` (positions) caps its buffers' growth."""
        return SessionKV(limit=limit)

    @torch.inference_mode()
    def embed(self, token_ids: list[int]) -> torch.Tensor:
        """``[1, len(token_ids), hidden]`` input embeddings (the head's shard only)."""
        if self.shard.embed is None:
            raise RuntimeError("this shard does not start at layer 0: it holds no embeddings")
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.shard.device)
        return self.shard.embed(ids)

    @torch.inference_mode()
    def run_layers(
        self, hidden: torch.Tensor, *, cache: SessionKV, start: int, end: int, position: int
    ) -> torch.Tensor:
        """One session's hidden states after layers ``start..end`` at positions ``position…``."""
        return self.run_batch(hidden, caches=[cache], pasts=[position], start=start, end=end)

    @torch.inference_mode()
    def run_batch(
        self,
        hidden: torch.Tensor,
        *,
        caches: Sequence[SessionKV],
        pasts: Sequence[int],
        start: int,
        end: int,
    ) -> torch.Tensor:
        """Hidden states ``[N, q, H]`` after layers ``start..end``; row ``i`` fills ``caches[i]``.

        Row ``i`` holds ``q`` new positions from ``pasts[i]`` on (its cache
        already holds ``pasts[i]``). Rows are independent: one row's values
        never reach another's output.
        """
        length = hidden.shape[1]
        device = hidden.device
        position_ids = torch.tensor(list(pasts), device=device, dtype=torch.long).unsqueeze(
            1
        ) + torch.arange(length, device=device, dtype=torch.long)
        masks: dict[str, torch.Tensor | None] = {}
        for index in range(start, end + 1):
            kind = self.shard.layer_types[index]
            if kind not in masks:
                window = self.sliding_window if kind == "sliding_attention" else None
                masks[kind] = attention_mask(pasts, length, window=window, device=device)
        position_embeddings = self.shard.rotary(hidden, position_ids)
        cache = BatchCache(caches)
        for index in range(start, end + 1):
            hidden = self.shard.layers[index](
                hidden,
                attention_mask=masks[self.shard.layer_types[index]],
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
            )
        return hidden

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (float32, ``[N, q, vocab]``) at every position: final norm + LM head (an echo)."""
        if self.shard.norm is None or self.shard.lm_head is None:
            raise RuntimeError("this shard does not end at the last layer: it holds no LM head")
        return self.shard.lm_head(self.shard.norm(hidden)).float()

    @torch.inference_mode()
    def last_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (float32, ``[N, vocab]``) for each row's last position: final norm + LM head."""
        if self.shard.norm is None or self.shard.lm_head is None:
            raise RuntimeError("this shard does not end at the last layer: it holds no LM head")
        normed = self.shard.norm(hidden[:, -1:, :])
        return self.shard.lm_head(normed)[:, -1].float()
