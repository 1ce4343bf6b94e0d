"""Tiny model, 2 hops (0-1, 2-3) with a delay link in front of the tail: ms per token against
the link's round trip (0, 10 and 40 ms), side by side in one run; physical floor 1.0 per hop.

Every decode step crosses the head → tail link and back, so each token pays
one round trip per hop: the slope of ms per token against the link's round
trip is at least 1.0 for the one delayed hop here, and whatever lies above
1.0 is what the protocol adds per round trip (a second exchange, a lost
coalescing). The link is :class:`tracker_app.localnet.delay_link.DelayLink`
(this kernel has no netem), one per delay, all in front of the same tail; a
route with no link and the whole model on one node are printed for scale.
Nodes run without a tracker (dev-open: called directly), one torch thread
each; ms per token is the decode's (see :func:`ms_per_token`), best of a few runs.

    .venv/bin/python bench/bench_link_latency.py
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from nodes_app.protocol.sse import sse_data
from tracker_app.localnet import LOOPBACK, NodeProcess, process_env, start_node
from tracker_app.localnet.delay_link import DelayLink

MODEL = "tiny-random-llama"
NEW_TOKENS = 128
SHORT_TOKENS = 8
RUNS = 5
ROUND_TRIPS_MS = (0.0, 10.0, 40.0)
FLOOR_PER_HOP = 1.0
PROMPT = "Tell me about meshes."


def node(layers: tuple[int, int], node_id: str, log_dir: Path) -> NodeProcess:
    return start_node(
        name=node_id, model=MODEL, layers=layers, env=process_env(), log_dir=log_dir,
        node_id=node_id, dev_open=True,
    )  # fmt: skip


def generate(hops: list[dict[str, Any]], max_tokens: int) -> tuple[int, float]:
    """One greedy streamed generation along ``hops``: tokens made, seconds it took."""
    body = {
        "request_id": f"bench-{time.monotonic_ns()}",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "plan": {"model": MODEL, "hops": hops},
    }
    tokens = 0
    began = time.perf_counter()
    with httpx.stream("POST", f"{hops[0]['endpoint']}/v1/generate", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if isinstance(chunk := sse_data(line), dict):
                if "error" in chunk:
                    raise RuntimeError(chunk["error"])
                tokens += len(chunk.get("meshnet_token_ids", []))
    return tokens, time.perf_counter() - began


def ms_per_token(hops: list[dict[str, Any]]) -> float:
    """Decode ms per token along ``hops``: a long and a short generation of the same prompt,
    the difference of their times over the difference of their tokens (the prefill and
    the request's own round trips cancel out; the stream may carry several tokens a frame)."""
    short_tokens, short_seconds = generate(hops, SHORT_TOKENS)
    tokens, seconds = generate(hops, NEW_TOKENS)
    if tokens <= short_tokens:
        raise RuntimeError(f"{tokens} tokens came back for {NEW_TOKENS}; nothing to time")
    return 1000 * (seconds - short_seconds) / (tokens - short_tokens)


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(x, y)`` points."""
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    numerator = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return numerator / sum((x - mean_x) ** 2 for x, _ in points)


def main() -> int:
    logs = Path(tempfile.mkdtemp(prefix="meshnet-bench-"))
    whole, head, tail = (
        node((0, 3), "bench-whole", logs),
        node((0, 1), "bench-head", logs),
        node((2, 3), "bench-tail", logs),
    )
    try:
        with contextlib.ExitStack() as links:
            endpoints = {
                rtt: links.enter_context(DelayLink((LOOPBACK, tail.port), one_way_ms=rtt / 2)).url
                for rtt in ROUND_TRIPS_MS
            }
            for started in (whole, head, tail):
                started.wait_serving(timeout=120)
            routes: dict[str, list[dict[str, Any]]] = {
                "1 node (0-3)": [whole.hop()],
                "2 hops, no link": [head.hop(), tail.hop()],
            }
            for rtt, endpoint in endpoints.items():
                routes[f"2 hops, {rtt:4.0f} ms RTT"] = [
                    head.hop(),
                    {**tail.hop(), "endpoint": endpoint},
                ]
            for hops in routes.values():
                generate(hops, SHORT_TOKENS)  # warm up: connections, first allocations
            best = dict.fromkeys(routes, float("inf"))
            for _ in range(RUNS):
                for name, hops in routes.items():
                    best[name] = min(best[name], ms_per_token(hops))
        linked = [(rtt, best[f"2 hops, {rtt:4.0f} ms RTT"]) for rtt in ROUND_TRIPS_MS]
        added = slope(linked)
        print(f"tiny model, {NEW_TOKENS} new tokens, greedy, one torch thread each, best of {RUNS}")
        for name, ms in best.items():
            print(f"  {name:22s} {ms:7.2f} ms/token  {1000 / ms:7.1f} tokens/s")
        above = linked[-1][1] - linked[0][1] - ROUND_TRIPS_MS[-1]
        print(f"ms per token added per ms of round trip: {added:.2f} "
              f"(physical floor {FLOOR_PER_HOP:.1f} for the one delayed hop); "
              f"above the floor at {ROUND_TRIPS_MS[-1]:.0f} ms: {above:+.1f} ms/token")  # fmt: skip
    finally:
        for started in (whole, head, tail):
            started.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
