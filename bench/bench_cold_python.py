"""A node's per-step Python, warm and right after a SmolLM2 shard's step.

A step's fixed work (its link frame built and read, its hidden state turned
to a tensor and checked, an event-loop turn) is measured on the tiny model,
whose layers leave the CPU's caches as they found them. On a real model the
layers stream tens of MB of weights through those caches first. This bench
times the same work, with the node's own wire code, in alternation: once on
its own (warm) and once right after a decode step of SmolLM2's layers 0-14
(one torch thread), and prints the median of each and their ratio (a report:
no target). Run: ``.venv/bin/python bench/bench_cold_python.py``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODEL = "smollm2-135m"
ROUNDS = 60


def main() -> int:
    import torch

    from nodes_app.runtime.engine.finite import all_finite
    from nodes_app.runtime.engine.runner import ShardRunner
    from nodes_app.runtime.loading.shard import load_shard
    from nodes_app.runtime.wire.entries import ForwardStep, LinkStep
    from nodes_app.runtime.wire.frames import decode_requests, encode_requests
    from nodes_app.runtime.wire.tensors import tensor_from_bytes, tensor_to_bytes
    from nodes_app.shared.sources import resolve_source

    torch.set_num_threads(1)
    shard = load_shard(
        model_key=MODEL, source=resolve_source(MODEL), start=0, end=14, progress=False
    )
    runner = ShardRunner(shard)
    cache = runner.new_cache()
    prompt = list(range(1, 41))
    hidden = runner.run_layers(runner.embed(prompt), cache=cache, start=0, end=14, position=0)
    position = len(prompt)
    loop = asyncio.new_event_loop()

    def step_work() -> float:
        """Seconds the step's fixed work takes: a frame out and in, a tensor, a loop turn."""
        began = time.perf_counter()
        step = ForwardStep(
            session_id="bench-session",
            start=15,
            end=29,
            position=position,
            dtype="float32",
            shape=(1, 1, shard.hidden_size),
            sampling=None,
        )
        frame = encode_requests([LinkStep(position, step, tensor_to_bytes(hidden[:, -1:]), "cap")])
        for entry in decode_requests(frame):
            assert isinstance(entry, LinkStep)
            tensor = tensor_from_bytes(entry.body, entry.step.dtype, entry.step.shape)
            assert all_finite(tensor)
        loop.run_until_complete(asyncio.sleep(0))
        return time.perf_counter() - began

    warm: list[float] = []
    cold: list[float] = []
    for _ in range(ROUNDS):
        warm.append(step_work())
        token = runner.embed([int(position % 1000) + 1])
        hidden = runner.run_layers(token, cache=cache, start=0, end=14, position=position)
        position += 1
        cold.append(step_work())
    loop.close()
    w, c = statistics.median(warm), statistics.median(cold)
    print(f"a step's fixed Python work, {ROUNDS} rounds, SmolLM2 layers 0-14, one torch thread")
    print(f"  warm (after the same work):        {1e6 * w:.0f} µs")
    print(f"  right after the shard's decode step: {1e6 * c:.0f} µs")
    print(f"ratio after a step / warm = {c / w:.2f}  (report)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
