"""Tiny model, 2 nodes (0-1, 2-3) ÷ 1 node (0-3): straight from the head (target >= 0.85)
and through the tracker (target >= 0.8).

The tiny model's forward takes well under a millisecond, so what these ratios
measure is what a hop costs per token: the transport between head and hop
(docs/adr/0002-node-runtime.md, "Hop links"), and through the tracker its
relay on top (ADR-0004). One network (a tracker and the three nodes, one torch
thread each), greedy, the same prompt and budget on every route, side by side
in one run: the head called with a plan signed by the tracker's key, and the
same request as a chat pinned to the route. Tokens/s counts the whole request
(prefill included), the best of a few runs. It also prints the CPU time the
route's node processes (and the tracker) spent per token (Linux ``/proc``),
which other load on the machine does not inflate.

    .venv/bin/python bench/bench_hops.py
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.processes import cpu_seconds
from bench.signed_plans import signed_direct
from nodes_app.protocol.sse import sse_data
from tracker_app.localnet import LocalNetwork, NodeProcess

MODEL = "tiny-random-llama"
NEW_TOKENS = 256
RUNS = 5
TARGET_DIRECT = 0.85  # 2 nodes ÷ 1 node straight from the head
TARGET_TRACKER = 0.8  # ... through the tracker
MESSAGES = [{"role": "user", "content": "Tell me about meshes."}]


class Routes:
    """The network and how to stream one greedy generation along a route of its nodes."""

    def __init__(self, net: LocalNetwork, api_key: str) -> None:
        assert net.tracker is not None and net.tracker_key_file is not None
        self.net, self.key_file = net, net.tracker_key_file
        self.auth = {"Authorization": f"Bearer {api_key}"}
        self.tracker_pid = net.tracker.process.pid

    def run(self, nodes: list[NodeProcess], *, via_tracker: bool) -> tuple[float, float, float]:
        """Tokens/s of one streamed generation along ``nodes``, the nodes' CPU ms per
        token, and the tracker's (0 straight from the head)."""
        pids = [node.process.pid for node in nodes]
        before = [cpu_seconds(pid) for pid in [*pids, self.tracker_pid]]
        tps = self.tokens_per_second(nodes, NEW_TOKENS, via_tracker=via_tracker)
        after = [cpu_seconds(pid) for pid in [*pids, self.tracker_pid]]
        spent = [b - a for a, b in zip(before, after, strict=True)]
        tracker = spent.pop() if via_tracker else 0.0
        return tps, 1000 * sum(spent) / NEW_TOKENS, 1000 * tracker / NEW_TOKENS

    def tokens_per_second(
        self, nodes: list[NodeProcess], max_tokens: int, *, via_tracker: bool
    ) -> float:
        """New tokens ÷ seconds of the whole request."""
        common = {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0.0}
        if via_tracker:
            url, headers = f"{self.net.url}/v1/chat/completions", self.auth
            body = {**common, "model": MODEL, "stream": True, "route": [n.node_id for n in nodes]}
        else:
            url, headers = f"{nodes[0].endpoint}/v1/generate", {}
            plan = {"model": MODEL, "hops": [node.hop() for node in nodes]}
            body = signed_direct({**common, "plan": plan}, self.key_file)
        tokens = 0
        began = time.perf_counter()
        with httpx.stream("POST", url, json=body, headers=headers, timeout=600) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if isinstance(chunk := sse_data(line), dict):
                    if "error" in chunk:
                        raise RuntimeError(chunk["error"])
                    tokens += len(chunk.get("meshnet_token_ids", []))  # the head's frames
                    if chunk.get("usage"):  # the tracker's last chunk
                        tokens = int(chunk["usage"]["completion_tokens"])
        return tokens / (time.perf_counter() - began)


def measure(routes: Routes, one: list[NodeProcess], two: list[NodeProcess], *, via_tracker: bool):
    """Best tokens/s and least CPU ms per token of each route over ``RUNS`` alternating runs."""
    best = {"one": 0.0, "two": 0.0}
    cpu = {"one": math.inf, "two": math.inf}
    tracker = {"one": math.inf, "two": math.inf}
    for _ in range(RUNS):
        for name, nodes in (("one", one), ("two", two)):
            tps, node_ms, tracker_ms = routes.run(nodes, via_tracker=via_tracker)
            best[name] = max(best[name], tps)
            cpu[name], tracker[name] = min(cpu[name], node_ms), min(tracker[name], tracker_ms)
    return best, cpu, tracker


def report(label: str, target: float, best, cpu, tracker, *, via_tracker: bool) -> None:
    per_hop_ms = 1000 * (1 / best["two"] - 1 / best["one"])
    extra = "  tracker CPU {:.2f} ms/token" if via_tracker else ""
    print(f"{label}:")
    print(f"  1 node  (0-3):       {best['one']:8.1f} tokens/s  node CPU {cpu['one']:.2f} ms/token"
          + extra.format(tracker["one"]))  # fmt: skip
    print(f"  2 nodes (0-1, 2-3):  {best['two']:8.1f} tokens/s  node CPU {cpu['two']:.2f} ms/token"
          + extra.format(tracker["two"])
          + f" (+{per_hop_ms:.2f} ms per token of wall clock)")  # fmt: skip
    print(f"  ratio 2 nodes / 1 node = {best['two'] / best['one']:.3f} (target >= {target})")


def main() -> int:
    # One machine, so the embedded mode; no rate limit on the benchmark's key.
    settings = {"MESHNET_RATE_LIMIT_PER_MINUTE": "100000", "REDIS_URL": None}
    with LocalNetwork.throwaway(env=settings) as net:
        net.start_tracker()
        api_key = net.create_api_key("bench")
        whole = net.add_node("whole", MODEL, (0, 3), wait=False)
        head = net.add_node("head", MODEL, (0, 1), wait=False)
        tail = net.add_node("tail", MODEL, (2, 3), wait=False)
        net.wait_for_route(MODEL)
        routes = Routes(net, api_key)
        one, two = [whole], [head, tail]
        for nodes in (one, two):  # warm up: connections, first allocations
            for via_tracker in (False, True):
                routes.tokens_per_second(nodes, 8, via_tracker=via_tracker)
        direct = measure(routes, one, two, via_tracker=False)
        tracked = measure(routes, one, two, via_tracker=True)
    print(f"tiny model, {NEW_TOKENS} new tokens, greedy, one torch thread each, best of {RUNS}")
    report("straight from the head", TARGET_DIRECT, *direct, via_tracker=False)
    report("through the tracker", TARGET_TRACKER, *tracked, via_tracker=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
