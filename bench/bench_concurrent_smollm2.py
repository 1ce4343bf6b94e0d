"""Concurrent SmolLM2 chats on a two-node route through the tracker ÷ one chat alone.

A tracker and two SmolLM2 nodes (layers 0-14, 15-29; one torch thread each,
their default session cap) on loopback. The same greedy chats run one at a
time (the baseline: one chat alone, its tokens/s), then 8 at once (target:
aggregate >= 3× one chat alone) and 32 at once (reported; past the
nodes' session cap the tracker queues them). Every concurrent answer must
equal its chat's lone answer, token for token (bench/chat_load.py).

    .venv/bin/python bench/bench_concurrent_smollm2.py [--tokens 32] [--levels 8 32]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chat_load import (
    LoadFigures,
    chat_mix,
    expected_answers,
    load_client,
    load_problems,
    run_load,
)
from tracker_app.localnet import LocalNetwork

MODEL = "smollm2-135m"
DISTINCT_PROMPTS = 4
TARGET_8 = 3.0


async def drive(url: str, key: str, args: argparse.Namespace) -> int:
    chat_url = f"{url}/v1/chat/completions"
    most = max(args.levels)
    chats = chat_mix(most, distinct=DISTINCT_PROMPTS, max_tokens=args.tokens)
    headers = {"Authorization": f"Bearer {key}"}
    async with load_client(headers, chats=most, timeout=1800) as client:
        expected = await expected_answers(client, chat_url, MODEL, chats)  # also warms up
        lone = list(dict.fromkeys(chats))
        began = time.perf_counter()
        alone_answers = await run_load(client, chat_url, MODEL, lone, concurrency=1)
        alone = LoadFigures.of(alone_answers, time.perf_counter() - began)
        rows = []
        problems = load_problems(alone_answers, expected)
        for level in args.levels:
            began = time.perf_counter()
            answers = await run_load(client, chat_url, MODEL, chats[:level])
            rows.append((level, LoadFigures.of(answers, time.perf_counter() - began)))
            problems += load_problems(answers, expected)
    print(
        f"SmolLM2 two nodes (0-14, 15-29), {args.tokens} tokens greedy per chat, "
        f"{DISTINCT_PROMPTS} distinct prompts, one torch thread per node"
    )
    print(f"  one chat alone (x{len(lone)} in turn): {alone.line()}")
    for level, figures in rows:
        ratio = figures.tokens_per_second / alone.tokens_per_second
        target = f"  (target >= {TARGET_8:g})" if level == 8 else ""
        print(f"  {level:3d} at once: {figures.line()}")
        print(f"  ratio aggregate {level} at once / one chat alone = {ratio:.2f}{target}")
    print(f"  every answer checked against its chat's lone greedy answer: {len(problems)} problems")
    for problem in problems[:10]:
        print(f"  PROBLEM {problem}")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--levels", type=int, nargs="+", default=[8, 32])
    args = parser.parse_args()
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
        net.add_node("head", MODEL, (0, 14), wait=False)
        net.add_node("tail", MODEL, (15, 29), wait=False)
        net.wait_for_route(MODEL)
        return asyncio.run(drive(net.url, key, args))


if __name__ == "__main__":
    sys.exit(main())
