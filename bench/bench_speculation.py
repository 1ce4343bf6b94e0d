"""Speculative decoding on a two-node SmolLM2 route: decode tokens/s with speculation ÷ without.

Side by side in one run, one torch thread per node, greedy: nodes 0-14 and
15-29 run as ``python -m nodes_app.runtime`` processes (dev-open, called
directly) and the head streams from ``/v1/generate``. Three routes: the tail
straight on loopback, and the tail behind a
:class:`~tracker_app.localnet.delay_link.DelayLink` of 5 and of 20 ms each way
(10 and 40 ms round trips). Two texts: repeating a given paragraph
(prompt-lookup drafts should be accepted) and writing a story (they mostly
should not). Each case runs with ``"speculation": "off"`` and with the
default, alternating, and prints decode tokens/s (after the first token) on ÷
off, the tokens each trip through the route delivered (a trip delivers its
accepted drafts and one token) and the drafts the head reported sent and
accepted (ADR-0028). Issue targets: the repeated paragraph over 40 ms ≥ 2×,
the story ≥ 0.95×, loopback ≥ 0.97×.

    .venv/bin/python bench/bench_speculation.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from nodes_app.protocol.sse import sse_data
from tracker_app.localnet import LOOPBACK, NodeProcess, process_env, start_node
from tracker_app.localnet.delay_link import DelayLink

MODEL = "smollm2-135m"
NEW_TOKENS = 96
RUNS = 3
ONE_WAY_MS = (5.0, 20.0)
PARAGRAPH = (
    "The lighthouse stood at the end of the harbour wall, white against the grey sea. "
    "Every evening the keeper climbed the spiral stairs, trimmed the wick and lit the lamp, "
    "and every morning he wrote the weather in a small blue book."
)
TEXTS = {
    "repeat a paragraph": f"Repeat the following paragraph exactly, twice:\n\n{PARAGRAPH}",
    "write a story": "Write a short story about a lighthouse keeper and a storm.",
}


def node(layers: tuple[int, int], node_id: str, log_dir: Path) -> NodeProcess:
    return start_node(
        name=node_id, model=MODEL, layers=layers, env=process_env(), log_dir=log_dir,
        node_id=node_id, dev_open=True,
    )  # fmt: skip


def decode(hops: list[dict[str, Any]], text: str, **extra: Any) -> tuple[float, dict[str, Any]]:
    """One greedy streamed answer: decode tokens/s after its first token, and its usage."""
    body = {
        "request_id": f"bench-{time.monotonic_ns()}",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": NEW_TOKENS,
        "temperature": 0.0,
        "plan": {"model": MODEL, "hops": hops},
        **extra,
    }
    tokens, first = 0, 0.0
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{hops[0]['endpoint']}/v1/generate", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not isinstance(chunk := sse_data(line), dict):
                continue
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            ids = chunk.get("meshnet_token_ids", [])
            if ids and not tokens:
                first = time.perf_counter()
            tokens += len(ids)
            usage = chunk.get("usage") or usage
    seconds = time.perf_counter() - first
    if tokens < 2:
        raise RuntimeError(f"{tokens} tokens came back; nothing to time")
    return (tokens - 1) / seconds, usage


def main() -> int:
    logs = Path(tempfile.mkdtemp(prefix="meshnet-bench-"))
    head, tail = node((0, 14), "bench-head", logs), node((15, 29), "bench-tail", logs)
    try:
        with ExitStack() as links:
            for started in (head, tail):
                started.wait_serving(timeout=300)
            routes = {"loopback": [head.hop(), tail.hop()]}
            for one_way in ONE_WAY_MS:
                link = links.enter_context(DelayLink((LOOPBACK, tail.port), one_way_ms=one_way))
                routes[f"{2 * one_way:.0f} ms RTT"] = [
                    head.hop(),
                    {**tail.hop(), "endpoint": link.url},
                ]
            print(f"SmolLM2-135M, nodes 0-14 | 15-29, {NEW_TOKENS} new tokens, greedy, "
                  f"one torch thread each, median of {RUNS}")  # fmt: skip
            for route, hops in routes.items():
                for name, text in TEXTS.items():
                    decode(hops, text)  # warm up: links, the route's timing on the head
                    on, off, drafted, accepted, delivered = [], [], 0, 0, 0
                    for _ in range(RUNS):
                        off.append(decode(hops, text, speculation="off")[0])
                        rate, usage = decode(hops, text)
                        on.append(rate)
                        drafted += usage.get("drafted_tokens", 0)
                        accepted += usage.get("accepted_tokens", 0)
                        delivered += usage["completion_tokens"]
                    plain, spec = statistics.median(off), statistics.median(on)
                    per_trip = delivered / (delivered - accepted)
                    print(f"  {route:10s} {name:20s} off {plain:6.1f} tok/s  on {spec:6.1f} tok/s"
                          f"  on ÷ off {spec / plain:5.2f}  {per_trip:4.2f} tokens a trip, "
                          f"drafts {drafted} sent, {accepted} accepted")  # fmt: skip
    finally:
        for started in (head, tail):
            started.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
