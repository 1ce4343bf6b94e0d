"""100 concurrent streamed chats on the tiny model through one tracker process.

Every answer must complete and equal the greedy answer of a single request
(nothing garbled or interleaved). Prints p50/p99 time to first token and the
aggregate tokens/s, against a baseline of the same requests sent one at a time.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nodes_app.protocol.sse import sse_data
from tracker_app.localnet import LocalNetwork

MODEL = "tiny-random-llama"
CONCURRENT = 100
SEQUENTIAL = 10
TOKENS = 32
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Count the nodes of the mesh."}],
    "max_tokens": TOKENS,
    "temperature": 0,
    "stream": True,
}


async def one(client: httpx.AsyncClient, url: str) -> tuple[str, float, int]:
    """(text, seconds to first token, completion tokens)."""
    began, first, text, tokens = time.perf_counter(), 0.0, "", 0
    async with client.stream("POST", url, json=BODY) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            frame = sse_data(line)
            if not isinstance(frame, dict):
                continue
            if "error" in frame:
                raise RuntimeError(frame["error"])
            content = frame["choices"][0]["delta"].get("content") or ""
            if content and not first:
                first = time.perf_counter() - began
            text += content
            tokens = frame.get("usage", {}).get("completion_tokens", tokens)
    return text, first, tokens


async def run(url: str, key: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=CONCURRENT + 10)
    async with httpx.AsyncClient(headers=headers, timeout=600, limits=limits) as client:
        expected, _, _ = await one(client, url)
        began = time.perf_counter()
        for _ in range(SEQUENTIAL):
            await one(client, url)
        sequential_tps = SEQUENTIAL * TOKENS / (time.perf_counter() - began)

        began = time.perf_counter()
        results = await asyncio.gather(*(one(client, url) for _ in range(CONCURRENT)))
        concurrent_tps = sum(r[2] for r in results) / (time.perf_counter() - began)
    garbled = sum(1 for text, _, _ in results if text != expected)
    complete = sum(1 for _, _, tokens in results if tokens == TOKENS)
    ttft = sorted(r[1] * 1000 for r in results)
    print(f"{CONCURRENT} concurrent streamed chats, tiny model, {TOKENS} tokens each")
    print(f"  complete: {complete}/{CONCURRENT}, garbled: {garbled}")
    print(
        f"  time to first token: p50 {statistics.median(ttft):.0f} ms, "
        f"p99 {ttft[int(0.99 * (len(ttft) - 1))]:.0f} ms"
    )
    print(
        f"  aggregate: {concurrent_tps:.0f} tokens/s concurrent vs "
        f"{sequential_tps:.0f} tokens/s one at a time"
    )
    print(f"  ratio concurrent / sequential = {concurrent_tps / sequential_tps:.2f}")
    if complete != CONCURRENT or garbled:
        raise SystemExit("some answers were incomplete or garbled")


def main() -> None:
    # One machine, so the embedded mode; no rate limit on the benchmark's key.
    settings = {
        # One key stands for every client: no per-key share in flight.
        "MESHNET_RATE_LIMIT_PER_MINUTE": "100000",
        "MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT": "100000",
        "MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT": "2000000000",
        "REDIS_URL": None,
    }
    with LocalNetwork.throwaway(env=settings) as net:
        net.start_tracker()
        key = net.create_api_key("bench")
        net.add_node("head", MODEL, (0, 1), wait=False)
        net.add_node("tail", MODEL, (2, 3), wait=False)
        net.wait_for_route(MODEL)
        asyncio.run(run(f"{net.url}/v1/chat/completions", key))


if __name__ == "__main__":
    main()
