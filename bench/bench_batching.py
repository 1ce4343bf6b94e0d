"""Continuous batching on one node, SmolLM2 layers 0-29, one torch thread, greedy (ADR-0010).

Two ratios, side by side in one run:

- **batch ÷ one at a time**: 8 sessions (contexts of 16-44 tokens) decoding as
  one batched forward per step (``ShardRunner.run_batch``), tokens/s over
  all of them, ÷ the same 8 sessions decoded one after another
  (``run_layers``, one forward per token). Target > 1: what batching buys a
  loaded node.
- **lone through the scheduler ÷ plain**: one session's decode steps through
  ``NodeService.head_forward`` (the step scheduler, its queue and its one
  callback) ÷ the same steps as plain jobs on the torch thread
  (``NodeService.compute`` of ``run_layers`` + sampling: the path before the
  scheduler). Target >= 0.97: batching costs a lone chat nothing.

Each figure is the best of three runs.

    .venv/bin/python bench/bench_batching.py [--sessions 8] [--steps 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "smollm2-135m"
RUNS = 3
LONE_TARGET = 0.97


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from nodes_app.runtime.engine.core import NodeService
    from nodes_app.runtime.engine.sampler import (
        SamplingParams,
        TailRequest,
        TokenPicker,
        sample_token,
    )
    from nodes_app.runtime.engine.trust import PlanGate
    from nodes_app.runtime.loading.shard import load_shard
    from nodes_app.shared.sources import resolve_source

    torch.set_num_threads(args.threads)
    shard = load_shard(
        model_key=MODEL, source=resolve_source(MODEL), start=0, end=29, progress=False
    )
    service = NodeService(shard, node_id="bench", gate=PlanGate(dev_open=True), kv_budget=2**32)
    runner = service.runner
    greedy = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, seed=0)
    greedy_tail = TailRequest(greedy)
    prompts = [[1 + (7 * i + j) % 2000 for j in range(16 + 4 * i)] for i in range(args.sessions)]

    def prefilled() -> tuple[list, list[int], list[int]]:
        caches, positions, nexts = [], [], []
        for prompt in prompts:
            cache = runner.new_cache()
            out = runner.run_layers(runner.embed(prompt), cache=cache, start=0, end=29, position=0)
            caches.append(cache)
            positions.append(len(prompt))
            nexts.append(int(runner.last_logits(out).argmax()))
        return caches, positions, nexts

    def one_at_a_time() -> float:
        caches, positions, nexts = prefilled()
        began = time.perf_counter()
        for cache, position, token in zip(caches, positions, nexts, strict=True):
            for step in range(args.steps):
                out = runner.run_layers(
                    runner.embed([token]), cache=cache, start=0, end=29, position=position + step
                )
                token = int(runner.last_logits(out).argmax())
        return args.sessions * args.steps / (time.perf_counter() - began)

    def batched() -> float:
        caches, positions, tokens = prefilled()
        began = time.perf_counter()
        with torch.inference_mode():
            for step in range(args.steps):
                hidden = runner.embed(tokens).view(len(tokens), 1, -1)
                out = runner.run_batch(
                    hidden,
                    caches=caches,
                    pasts=[p + step for p in positions],
                    start=0,
                    end=29,
                )
                tokens = runner.last_logits(out).argmax(dim=-1).tolist()
        return args.sessions * args.steps / (time.perf_counter() - began)

    async def lone(through_batcher: bool) -> float:
        session = service.admission.open_session("lone", 0, 29)
        session.picker = TokenPicker(greedy)
        try:
            async with session.lock:
                choice = await service.head_forward(session, prompts[0], greedy_tail)
                assert not isinstance(choice, bytes)
                token = choice.token_id
                session.position += len(prompts[0])
            began = time.perf_counter()
            for _ in range(args.steps):
                ids = [token]
                if through_batcher:
                    choice = await service.head_forward(session, ids, greedy_tail)
                    assert not isinstance(choice, bytes)
                    token = choice.token_id
                else:
                    assert session.picker is not None

                    def plain(
                        ids: list[int] = ids,
                        position: int = session.position,
                        generator: torch.Generator = session.picker.generator,
                    ) -> int:
                        out = runner.run_layers(
                            runner.embed(ids),
                            cache=session.cache,
                            start=0,
                            end=29,
                            position=position,
                        )
                        logits = runner.last_logits(out)[0]
                        return sample_token(logits, greedy, generator)

                    token = await service.compute(plain)
                session.position += 1
            return args.steps / (time.perf_counter() - began)
        finally:
            service.cancel("lone")

    async def lone_pair() -> tuple[float, float]:
        best_batcher, best_plain = 0.0, 0.0
        for _ in range(RUNS):
            best_plain = max(best_plain, await lone(False))
            best_batcher = max(best_batcher, await lone(True))
        return best_batcher, best_plain

    one = max(one_at_a_time() for _ in range(RUNS))
    many = max(batched() for _ in range(RUNS))
    through, plain = asyncio.run(lone_pair())
    service.close()

    print(
        f"{args.sessions} sessions, {args.steps} decode steps each, {args.threads} torch thread(s)"
    )
    print(f"batched {many:7.1f} tok/s ÷ one at a time {one:7.1f} tok/s = {many / one:.2f}")
    ratio = through / plain
    verdict = "meets" if ratio >= LONE_TARGET else "misses"
    print(
        f"lone through the scheduler {through:6.1f} tok/s ÷ plain {plain:6.1f} tok/s = "
        f"{ratio:.3f} ({verdict} the {LONE_TARGET} target)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
