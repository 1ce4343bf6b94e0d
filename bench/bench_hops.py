"""Tiny model, 2 nodes (0-1, 2-3) ÷ 1 node (0-3), streamed straight from the head (target >= 0.8).

The tiny model's forward takes well under a millisecond, so what this ratio
measures is what a hop costs per token: the transport between head and hop
(docs/adr/0002-node-runtime.md, "Hop links"). Side by side in one run, one
torch thread per node, greedy, the same prompt and budget on both routes;
tokens/s counts the whole request (prefill included), the best of a few runs.

    .venv/bin/python bench/bench_hops.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nodes_app.protocol import sse_data
from tracker_app.localnet import NodeProcess, process_env, start_node

MODEL = "tiny-random-llama"
NEW_TOKENS = 256
RUNS = 5
TARGET = 0.8
PROMPT = "Tell me about meshes."


def node(layers: tuple[int, int], node_id: str, log_dir: Path) -> NodeProcess:
    """A node without a tracker (dev-open: called directly), one torch thread, as ``node_id``."""
    return start_node(
        name=node_id, model=MODEL, layers=layers, env=process_env(), log_dir=log_dir,
        node_id=node_id, dev_open=True,
    )  # fmt: skip


def tokens_per_second(hops: list[tuple[NodeProcess, int, int]], max_tokens: int) -> float:
    """One streamed generation along ``hops``: new tokens ÷ seconds of the whole request."""
    import httpx

    body = {
        "request_id": f"bench-{time.monotonic_ns()}",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "plan": {"model": MODEL, "hops": [n.hop(start, end) for n, start, end in hops]},
    }
    tokens = 0
    began = time.perf_counter()
    head = hops[0][0].endpoint
    with httpx.stream("POST", f"{head}/v1/generate", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if isinstance(chunk := sse_data(line), dict):
                if "error" in chunk:
                    raise RuntimeError(chunk["error"])
                tokens += len(chunk.get("meshnet_token_ids", []))
    return tokens / (time.perf_counter() - began)


def main() -> int:
    logs = Path(tempfile.mkdtemp(prefix="meshnet-bench-"))
    whole, head, tail = (
        node((0, 3), "bench-whole", logs),
        node((0, 1), "bench-head", logs),
        node((2, 3), "bench-tail", logs),
    )
    try:
        for started in (whole, head, tail):
            started.wait_serving(timeout=120)
        one = [(whole, 0, 3)]
        two = [(head, 0, 1), (tail, 2, 3)]
        for route in (one, two):
            tokens_per_second(route, 8)  # warm up: connections, first allocations
        best_one = best_two = 0.0
        for _ in range(RUNS):
            best_one = max(best_one, tokens_per_second(one, NEW_TOKENS))
            best_two = max(best_two, tokens_per_second(two, NEW_TOKENS))
        ratio = best_two / best_one
        per_hop_ms = 1000 * (1 / best_two - 1 / best_one)
        print(f"tiny model, {NEW_TOKENS} new tokens, greedy, one torch thread each, best of {RUNS}")
        print(f"  1 node  (0-3):       {best_one:8.1f} tokens/s")
        print(f"  2 nodes (0-1, 2-3):  {best_two:8.1f} tokens/s  (+{per_hop_ms:.2f} ms per token)")
        print(f"ratio 2 nodes / 1 node = {ratio:.3f} (target >= {TARGET})")
    finally:
        for started in (whole, head, tail):
            started.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
