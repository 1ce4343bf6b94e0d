"""Decode tokens/s at 1,000 tokens of context ÷ at 20 tokens of context (target >= 0.80).

SmolLM2 layers 0-29 in the node's shard runner, one torch thread, greedy:
with the per-session KV cache a decode step feeds one position, so a longer
context only adds attention over cached keys, never a re-computation of the
prefix. Each figure is the best of three runs of 64 decode steps after the
prefill.

    .venv/bin/python bench/bench_kv_cache.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "smollm2-135m"
STEPS = 64
RUNS = 3
TARGET = 0.80


def main() -> int:
    import torch

    from nodes_app.runtime.engine.runner import ShardRunner
    from nodes_app.runtime.loading.shard import load_shard
    from nodes_app.shared.sources import resolve_source

    torch.set_num_threads(1)
    shard = load_shard(
        model_key=MODEL, source=resolve_source(MODEL), start=0, end=29, progress=False
    )
    runner = ShardRunner(shard)
    tokenizer = shard.tokenizer
    assert tokenizer is not None
    text = " ".join(["The lighthouse keeper climbed the stairs and watched the sea."] * 120)
    corpus = tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode_tps(context: int) -> float:
        cache = runner.new_cache()
        hidden = runner.run_layers(
            runner.embed(corpus[:context]), cache=cache, start=0, end=29, position=0
        )
        token = int(runner.last_logits(hidden).argmax())
        began = time.perf_counter()
        for offset in range(STEPS):
            hidden = runner.run_layers(
                runner.embed([token]), cache=cache, start=0, end=29, position=context + offset
            )
            token = int(runner.last_logits(hidden).argmax())
        return STEPS / (time.perf_counter() - began)

    decode_tps(20)  # warm up
    short = max(decode_tps(20) for _ in range(RUNS))
    long = max(decode_tps(1000) for _ in range(RUNS))
    print(f"decode at 20 tokens of context:    {short:.2f} tokens/s")
    print(f"decode at 1000 tokens of context:  {long:.2f} tokens/s")
    print(f"ratio tps(1000) / tps(20) = {long / short:.3f} (target >= {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
