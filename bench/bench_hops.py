"""Tiny model, 2 nodes (0-1, 2-3) ÷ 1 node (0-3), streamed straight from the head (target >= 0.8).

The tiny model's forward takes well under a millisecond, so what this ratio
measures is what a hop costs per token: the transport between head and hop
(docs/adr/0002-node-runtime.md, "Hop links"). Side by side in one run, one
torch thread per node, greedy, the same prompt and budget on both routes;
tokens/s counts the whole request (prefill included), the best of a few runs.
It also prints the CPU time the route's node processes spent per token
(Linux ``/proc``), which other load on the machine does not inflate.

    .venv/bin/python bench/bench_hops.py
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nodes_app.protocol.sse import sse_data
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


def cpu_seconds(node: NodeProcess) -> float:
    """CPU time the node's process has used so far, all threads (Linux ``/proc``)."""
    fields = Path(f"/proc/{node.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(hops: list[tuple[NodeProcess, int, int]], max_tokens: int) -> tuple[float, float]:
    """Tokens/s of one streamed generation along ``hops``, and the nodes' CPU ms per token.

    CPU time does not depend on what else the machine runs, so it shows what
    a hop costs in work even where other processes blur the wall clock.
    """
    nodes = [node for node, _, _ in hops]
    before = sum(cpu_seconds(node) for node in nodes)
    tps = tokens_per_second(hops, max_tokens)
    cpu = sum(cpu_seconds(node) for node in nodes) - before
    return tps, 1000 * cpu / max_tokens


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
        cpu_one = cpu_two = math.inf
        for _ in range(RUNS):
            tps, cpu = run(one, NEW_TOKENS)
            best_one, cpu_one = max(best_one, tps), min(cpu_one, cpu)
            tps, cpu = run(two, NEW_TOKENS)
            best_two, cpu_two = max(best_two, tps), min(cpu_two, cpu)
        ratio = best_two / best_one
        per_hop_ms = 1000 * (1 / best_two - 1 / best_one)
        print(f"tiny model, {NEW_TOKENS} new tokens, greedy, one torch thread each, best of {RUNS}")
        print(f"  1 node  (0-3):       {best_one:8.1f} tokens/s  node CPU {cpu_one:.2f} ms/token")
        print(f"  2 nodes (0-1, 2-3):  {best_two:8.1f} tokens/s  node CPU {cpu_two:.2f} ms/token "
              f"(+{per_hop_ms:.2f} ms per token of wall clock)")  # fmt: skip
        print(f"ratio 2 nodes / 1 node = {ratio:.3f} (target >= {TARGET})")
    finally:
        for started in (whole, head, tail):
            started.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
