"""Two-node SmolLM2 pipeline over HTTP ÷ transformers ``generate`` in one process (target >= 0.90).

Side by side in one run, same weights, one torch thread everywhere, greedy,
128 new tokens: nodes 0-14 and 15-29 run as separate ``python -m
nodes_app.runtime`` processes and the head streams from ``/v1/generate``; the
baseline is ``generate`` on the whole model in this process. Tokens/s counts
the whole request (prefill included) on both sides; the better of two runs each.

    .venv/bin/python bench/bench_pipeline.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.processes import pin
from nodes_app.protocol.sse import sse_data
from tracker_app.localnet import NodeProcess, process_env, start_node

MODEL = "smollm2-135m"
NEW_TOKENS = 128
RUNS = 3
TARGET = 0.90
PROMPT = "Write a detailed story about a lighthouse keeper who finds a message in a bottle."


def node(layers: tuple[int, int], node_id: str, log_dir: Path) -> NodeProcess:
    """A node without a tracker (dev-open: called directly), one torch thread, as ``node_id``."""
    return start_node(
        name=node_id, model=MODEL, layers=layers, env=process_env(), log_dir=log_dir,
        node_id=node_id, dev_open=True,
    )  # fmt: skip


def pipeline_run(head: str, tail: str, max_tokens: int) -> tuple[list[int], float]:
    import httpx

    body = {
        "request_id": f"bench-{time.monotonic_ns()}",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "plan": {
            "model": MODEL,
            "hops": [
                {"node_id": "bench-head", "endpoint": head, "start_layer": 0, "end_layer": 14},
                {"node_id": "bench-tail", "endpoint": tail, "start_layer": 15, "end_layer": 29},
            ],
        },
    }
    ids: list[int] = []
    began = time.perf_counter()
    with httpx.stream("POST", f"{head}/v1/generate", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if isinstance(chunk := sse_data(line), dict):
                if "error" in chunk:
                    raise RuntimeError(chunk["error"])
                ids.extend(chunk.get("meshnet_token_ids", []))
    return ids, time.perf_counter() - began


def main() -> int:
    import torch

    from nodes_app.runtime.loading.shard import load_causal_lm, load_tokenizer
    from nodes_app.shared.prompting import prompt_token_ids
    from nodes_app.shared.sources import resolve_source

    torch.set_num_threads(1)
    logs = Path(tempfile.mkdtemp(prefix="meshnet-bench-"))
    head_node, tail_node = node((0, 14), "bench-head", logs), node((15, 29), "bench-tail", logs)
    head, tail = head_node.endpoint, tail_node.endpoint
    try:
        source = resolve_source(MODEL)
        model: Any = load_causal_lm(source)  # transformers' generate(), unknown to nn.Module
        prompt = prompt_token_ids(load_tokenizer(source), [{"role": "user", "content": PROMPT}])
        head_node.wait_serving(timeout=300)
        tail_node.wait_serving(timeout=300)

        def baseline() -> tuple[list[int], float]:
            began = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(
                    torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                    min_new_tokens=NEW_TOKENS,
                )  # fmt: skip
            return out[0, len(prompt) :].tolist(), time.perf_counter() - began

        all_cpus = set(os.sched_getaffinity(0))
        # "one core": all model work on CPU 0 (the pipeline is sequential, so one
        # core is what generate gets too); the client reading the stream elsewhere.
        layouts = {"one core for the model": ({0}, all_cpus - {0} or {0})}
        layouts["unpinned (OS scheduling)"] = (all_cpus, all_cpus)
        pipeline_run(head, tail, 4)  # warm both sides up
        print(
            f"prompt {len(prompt)} tokens, {NEW_TOKENS} new tokens, greedy, one torch thread each"
        )
        ratios = {}
        for name, (model_cpus, client_cpus) in layouts.items():
            baseline_best = pipeline_best = 0.0
            base_ids: list[int] = []
            pipe_ids: list[int] = []
            for _ in range(RUNS):
                pin(os.getpid(), model_cpus)
                base_ids, seconds = baseline()
                baseline_best = max(baseline_best, len(base_ids) / seconds)
                for started in (head_node, tail_node):
                    pin(started.process.pid, model_cpus)
                pin(os.getpid(), client_cpus)
                pipe_ids, seconds = pipeline_run(head, tail, NEW_TOKENS)
                pipeline_best = max(pipeline_best, len(pipe_ids) / seconds)
            ratios[name] = pipeline_best / baseline_best
            print(f"[{name}]")
            print(
                f"  generate, one process:  {baseline_best:.2f} tokens/s ({len(base_ids)} tokens)"
            )
            print(
                f"  pipeline 0-14 + 15-29:  {pipeline_best:.2f} tokens/s ({len(pipe_ids)} tokens)"
            )
            print(f"  same tokens as generate: {pipe_ids == base_ids[: len(pipe_ids)]}")
            print(f"  ratio {ratios[name]:.3f}")
        headline = ratios["one core for the model"]
        print(f"ratio pipeline / generate = {headline:.3f} (target >= {TARGET}); "
              f"unpinned {ratios['unpinned (OS scheduling)']:.3f}")  # fmt: skip
    finally:
        head_node.stop()
        tail_node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
