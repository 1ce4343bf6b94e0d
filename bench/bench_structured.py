"""SmolLM2's decode speed with a JSON schema ÷ without, through the tracker (ADR-0022).

A tracker and two SmolLM2 nodes (layers 0-14, 15-29; one torch thread each)
on loopback; the tail follows the schema's grammar (ADR-0022). Rounds
alternate the same greedy streamed chat with ``response_format`` (a person
with a biography, so the answer runs some dozens of tokens) and without. Each
chat's decode speed is its tokens after the first over the time from the
first to the last (the prompts differ by nothing, the answers by their
length, so the prefill is left out). Prints the median over rounds of the
ratio (target >= 0.9) and checks every constrained answer against the schema.

    .venv/bin/python bench/bench_structured.py [--rounds 5] [--tokens 96]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tracker_app.localnet import LocalNetwork

MODEL = "smollm2-135m"
TARGET = 0.9
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "biography": {"type": "string"},
    },
    "required": ["name", "age", "city", "hobbies", "biography"],
    "additionalProperties": False,
}
PROMPT = [
    {
        "role": "user",
        "content": "Describe a fictional person as JSON: name, age, city, hobbies and a "
        "one-sentence biography.",
    }
]


def decode(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, int, str]:
    """(decode tokens/s, completion tokens, text) of one streamed chat."""
    stamps: list[float] = []
    text, tokens = "", 0
    with client.stream("POST", url, json={**body, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                piece = choice["delta"].get("content")
                if piece:
                    stamps.append(time.perf_counter())
                    text += piece
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if len(stamps) < 2 or tokens < 2:
        raise RuntimeError(f"too short an answer to time: {text!r}")
    return (tokens - 1) / (stamps[-1] - stamps[0]), tokens, text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    settings = {"MESHNET_RATE_LIMIT_PER_MINUTE": "100000", "REDIS_URL": None}
    with LocalNetwork.throwaway(env=settings) as net:
        net.start_tracker()
        key = net.create_api_key("bench")
        net.add_node("head", MODEL, (0, 14), wait=False)
        net.add_node("tail", MODEL, (15, 29), wait=False)
        net.wait_for_route(MODEL)
        url = f"{net.url}/v1/chat/completions"
        common = {"model": MODEL, "messages": PROMPT, "max_tokens": args.tokens, "temperature": 0}
        schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        ratios, rows, problems = [], [], 0
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(headers=headers, timeout=600) as client:
            decode(client, url, common)  # warm-up: both nodes' first steps
            for _ in range(args.rounds):
                free_tps, free_tokens, _ = decode(client, url, common)
                held_tps, held_tokens, text = decode(
                    client, url, {**common, "response_format": schema}
                )
                if held_tokens < args.tokens:  # finished: the whole answer must be valid
                    try:
                        jsonschema.validate(json.loads(text), PERSON)
                    except (ValueError, jsonschema.ValidationError) as error:
                        problems += 1
                        print(f"  PROBLEM {error}: {text!r}")
                ratios.append(held_tps / free_tps)
                rows.append((free_tps, free_tokens, held_tps, held_tokens))
    print(
        "SmolLM2 two nodes (0-14, 15-29) through the tracker, greedy, streamed; decode "
        f"tokens/s after the first token, {args.rounds} alternating rounds"
    )
    for free_tps, free_tokens, held_tps, held_tokens in rows:
        print(
            f"  without {free_tps:6.2f} tok/s ({free_tokens} tokens)   "
            f"with the schema {held_tps:6.2f} tok/s ({held_tokens} tokens)   "
            f"ratio {held_tps / free_tps:.3f}"
        )
    ratio = statistics.median(ratios)
    print(f"  ratio with a schema / without (median) = {ratio:.3f}  (target >= {TARGET:g})")
    print(f"  constrained answers checked against the schema: {problems} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
