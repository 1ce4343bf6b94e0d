"""Run a range of decoder layers with a per-session KV cache, through transformers' layer classes.

One ``DynamicCache(config=…)`` per session holds this node's layers only:
attention modules index the cache by their global layer number, so a cache
for layers 15-29 simply leaves 0-14 empty. Positions are explicit, so a hop
that starts at layer 22 of a node whose shard starts at 0 runs correctly.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from nodes_app.runtime.loading import LoadedShard

_MASKS = {
    "full_attention": create_causal_mask,
    "sliding_attention": create_sliding_window_causal_mask,
}


class ShardExecutor:
    """Stateless compute over a :class:`LoadedShard`; sessions own their caches."""

    def __init__(self, shard: LoadedShard) -> None:
        self.shard = shard
        self.config = shard.config

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    @staticmethod
    def cache_length(cache: DynamicCache, layer: int) -> int:
        return int(cache.get_seq_length(layer))

    @torch.inference_mode()
    def embed(self, token_ids: list[int]) -> torch.Tensor:
        if self.shard.embed is None:
            raise RuntimeError("this shard does not start at layer 0: it holds no embeddings")
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.shard.device)
        return self.shard.embed(ids)

    @torch.inference_mode()
    def run_layers(
        self, hidden: torch.Tensor, *, cache: DynamicCache, start: int, end: int, position: int
    ) -> torch.Tensor:
        """Hidden states after layers ``start..end`` for positions ``position…``; fills ``cache``."""
        length = hidden.shape[1]
        position_ids = torch.arange(
            position, position + length, device=hidden.device, dtype=torch.long
        ).unsqueeze(0)
        masks: dict[str, Any] = {}
        for index in range(start, end + 1):
            kind = self.shard.layer_types[index]
            if kind not in masks:
                # Size the mask by a layer this shard owns (layer 0 may be empty here).
                masks[kind] = _MASKS[kind](
                    config=self.config,
                    inputs_embeds=hidden,
                    attention_mask=None,
                    cache=cache,
                    position_ids=position_ids,
                    layer_idx=index,
                )
        position_embeddings = self.shard.rotary(hidden, position_ids)
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
    def last_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (float32, shape ``[vocab]``) for the last position: final norm + LM head."""
        if self.shard.norm is None or self.shard.lm_head is None:
            raise RuntimeError("this shard does not end at the last layer: it holds no LM head")
        normed = self.shard.norm(hidden[:, -1:, :])
        return self.shard.lm_head(normed)[0, -1].float()
