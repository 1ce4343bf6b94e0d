"""Tiny model, two heads (0-1) and two tails (2-3) behind one tracker: 40 chats at once,
every node's share of them, and their aggregate tokens/s ÷ the same chats pinned to one
route, side by side in one run (rounds alternate).

A network's capacity grows with its nodes only if the replicas carry traffic:
the target is that every node serves at least 15 % of the chats and that every
answer is the pinned route's, token for token (greedy). The throughput ratio
is printed for scale: on a machine with fewer cores than node processes the
replicas share the same cores, so it shows what the routing costs or saves
there, not what four machines would serve.

    .venv/bin/python bench/bench_replicas.py [--chats 40] [--tokens 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from tracker_app.localnet import LocalNetwork, fresh_process_database, wait_until

MODEL = "tiny-random-llama"
PROMPT = [{"role": "user", "content": "Tell me about the sea."}]
HEADS = ("head-a", "head-b")
TAILS = ("tail-a", "tail-b")
SHARE_TARGET = 0.15


def chat(url: str, key: str, tokens: int, route: list[str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL, "messages": PROMPT, "max_tokens": tokens, "temperature": 0,
    }  # fmt: skip
    if route is not None:
        body["route"] = route
    response = httpx.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=300,
    )
    response.raise_for_status()
    return dict(response.json())


def candidates(url: str, key: str) -> int:
    """How many candidate routes the tracker's ``/v1/routing`` lists for the model."""
    table = httpx.get(
        f"{url}/v1/routing", params={"model": MODEL}, headers={"Authorization": f"Bearer {key}"}
    ).json()
    return len(table["models"][0]["routes"])


def burst(
    url: str, key: str, args: argparse.Namespace, route: list[str] | None
) -> tuple[list[dict[str, Any]], float]:
    """``args.chats`` chats at once; their answers and aggregate completion tokens/s."""
    began = time.perf_counter()
    with ThreadPoolExecutor(args.chats) as pool:
        answers = list(pool.map(lambda _: chat(url, key, args.tokens, route), range(args.chats)))
    seconds = time.perf_counter() - began
    tokens = sum(answer["usage"]["completion_tokens"] for answer in answers)
    return answers, tokens / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    settings = {
        # One key stands for every client: no per-key share in flight.
        "MESHNET_RATE_LIMIT_PER_MINUTE": "1000000",
        "MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT": "100000",
        "MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT": "2000000000",
        "MESHNET_ROUTE_MIN_SAMPLE_TOKENS": "1",
    }
    with fresh_process_database() as database_url:
        tmp = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
        with LocalNetwork.throwaway(
            workdir=tmp, database_url=database_url, env=settings
        ) as network:
            network.start_tracker()
            key = network.create_api_key("bench")
            for name in HEADS:
                network.add_node(name, MODEL, (0, 1), wait=False)
            for name in TAILS:
                network.add_node(name, MODEL, (2, 3), wait=False)
            network.wait_for_route(MODEL)
            ids = {name: node.node_id for name, node in network.nodes.items()}
            wait_until(
                lambda: candidates(network.url, key) == len(HEADS) * len(TAILS),
                timeout=60,
                what="every head with every tail in the routing table",
            )
            pinned_route = [ids["head-a"], ids["tail-a"]]
            expected = chat(network.url, key, args.tokens, pinned_route)
            text = expected["choices"][0]["message"]["content"]

            served: Counter[str] = Counter()
            pinned_tps, spread_tps, wrong = [], [], 0
            for _ in range(args.rounds):
                _, tps = burst(network.url, key, args, pinned_route)
                pinned_tps.append(tps)
                answers, tps = burst(network.url, key, args, None)
                spread_tps.append(tps)
                served.update(hop["node_id"] for a in answers for hop in a["meshnet"]["hops"])
                wrong += sum(a["choices"][0]["message"]["content"] != text for a in answers)

    chats = args.chats * args.rounds
    print(
        f"{MODEL}: {len(HEADS)} heads x {len(TAILS)} tails, {args.rounds} rounds of "
        f"{args.chats} chats at once ({args.tokens} tokens), unpinned and pinned alternating"
    )
    lowest = min(served[ids[name]] / chats for name in ids)
    for name in ids:
        print(f"  {name:<7} served {served[ids[name]] / chats:6.1%} of the unpinned chats")
    ratio = sum(spread_tps) / sum(pinned_tps)
    print(
        f"  aggregate tokens/s: unpinned {sum(spread_tps) / args.rounds:.1f}, pinned to "
        f"head-a -> tail-a {sum(pinned_tps) / args.rounds:.1f}; ratio {ratio:.3f}"
    )
    print(f"  answers unlike the pinned route's: {wrong} of {chats}")
    met = lowest >= SHARE_TARGET and wrong == 0
    print(
        f"  least share {lowest:.1%} (target >= {SHARE_TARGET:.0%}), every answer the pinned "
        f"route's: {'met' if met else 'NOT MET'}"
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
