"""The start-up benchmark: decode tokens/s of this node's own layers, reported at registration."""

from __future__ import annotations

import time

import torch

from nodes_app.runtime.engine.runner import ShardRunner


def measure_decode_tps(runner: ShardRunner, *, context: int = 16, steps: int = 16) -> float:
    """Decode steps per second over the shard's layers after a ``context``-token prefill."""
    shard = runner.shard
    cache = runner.new_cache()
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        hidden = torch.randn(
            1, context, shard.hidden_size, generator=generator, dtype=torch.float32
        ).to(device=shard.device, dtype=shard.dtype)
        # Families whose layers also take the token ids (Gemma 4): any ids will do.
        ids = [0] * context
        runner.run_layers(
            hidden, cache=cache, start=shard.start, end=shard.end, position=0, token_ids=ids
        )
        step = hidden[:, -1:, :]
        began = time.perf_counter()
        for offset in range(steps):
            out = runner.run_layers(
                step,
                cache=cache,
                start=shard.start,
                end=shard.end,
                position=context + offset,
                token_ids=ids[:1],
            )
            if shard.is_last:
                runner.last_logits(out)
        elapsed = time.perf_counter() - began
    return steps / elapsed if elapsed > 0 else 0.0
