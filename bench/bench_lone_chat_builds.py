"""One lone tiny chat through the tracker: this build ÷ a baseline build, side by side.

Checks the baseline commit (argument, default ``159cbfe``: before continuous
batching, ADR-0010)
out into a temporary git worktree and starts the same network from each
tree — a tracker and two tiny-model nodes (layers 0-1, 2-3), each tree's own
``tracker_app.localnet`` in a process of its own — then streams the same
greedy chat, one at a time, in alternating rounds: a round on one build, a
round on the other. Tokens/s counts the whole request as the client sees it
(prefill included); each build's figure is the median of its rounds. Target:
this build >= 0.97 × the baseline. Both answers must be equal.

    .venv/bin/python bench/bench_lone_chat_builds.py [BASELINE] [--rounds 7] [--chats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nodes_app.protocol.sse import sse_data

ROOT = Path(__file__).resolve().parent.parent

MODEL = "tiny-random-llama"
TOKENS = 64
TARGET = 0.97
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about the mesh, at length."}],
    "max_tokens": TOKENS,
    "temperature": 0,
    "stream": True,
}

# Run in a tree's own root: that tree's localnet starts that tree's tracker and nodes,
# prints where they are, and stops them all when its stdin closes.
NETWORK_SCRIPT = """
import json, sys
from tracker_app.localnet import LocalNetwork
settings = {"MESHNET_RATE_LIMIT_PER_MINUTE": "100000", "REDIS_URL": None}
with LocalNetwork.throwaway(env=settings) as net:
    net.start_tracker()
    key = net.create_api_key("bench")
    net.add_node("head", sys.argv[1], (0, 1), wait=False)
    net.add_node("tail", sys.argv[1], (2, 3), wait=False)
    net.wait_for_route(sys.argv[1])
    print(json.dumps({"url": net.url, "key": key}), flush=True)
    sys.stdin.read()
"""


@contextmanager
def baseline_tree(commit: str) -> Iterator[Path]:
    """``commit`` checked out in a temporary git worktree, removed afterwards."""
    where = Path(tempfile.mkdtemp(prefix="meshnet-baseline-")) / "tree"
    git = ["git", "-C", str(ROOT)]
    subprocess.run([*git, "worktree", "add", "--detach", str(where), commit], check=True)
    try:
        yield where
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(where)], check=False)


@contextmanager
def network_from(tree: Path) -> Iterator[dict[str, str]]:
    """A network started by ``tree``'s own localnet: ``{"url", "key"}`` while it runs."""
    process = subprocess.Popen(
        [sys.executable, "-c", NETWORK_SCRIPT, MODEL],
        cwd=tree,
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the network of {tree} did not start")
        yield json.loads(line)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=120)


def _env() -> dict[str, str]:
    """This process's environment without PYTHONPATH: a tree imports its own code."""
    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


def lone_chat(client: httpx.Client, network: dict[str, str]) -> tuple[str, int, float]:
    """(text, completion tokens, seconds from sending to the end of the stream)."""
    began = time.perf_counter()
    text, tokens = "", 0
    with client.stream(
        "POST",
        f"{network['url']}/v1/chat/completions",
        json=BODY,
        headers={"Authorization": f"Bearer {network['key']}"},
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            frame = sse_data(line)
            if isinstance(frame, dict) and "choices" in frame:
                text += frame["choices"][0]["delta"].get("content") or ""
                tokens = frame.get("usage", {}).get("completion_tokens", tokens)
    return text, tokens, time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", nargs="?", default="159cbfe")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--chats", type=int, default=5, help="lone chats per round")
    args = parser.parse_args()
    with (
        baseline_tree(args.baseline) as tree,
        network_from(ROOT) as this,
        network_from(tree) as base,
        httpx.Client(timeout=300) as client,
    ):
        builds = {"this build": this, f"baseline {args.baseline}": base}
        answers = {name: lone_chat(client, network)[0] for name, network in builds.items()}
        tps: dict[str, list[float]] = {name: [] for name in builds}
        for _ in range(args.rounds):
            for name, network in builds.items():
                tokens = seconds = 0.0
                for _ in range(args.chats):
                    _, n, s = lone_chat(client, network)
                    tokens, seconds = tokens + n, seconds + s
                tps[name].append(tokens / seconds)
    this_tps, base_tps = (statistics.median(values) for values in tps.values())
    print(
        f"one lone tiny chat at a time through the tracker, 2 nodes (0-1, 2-3), {TOKENS} tokens "
        f"greedy; {args.rounds} alternating rounds of {args.chats} chats per build"
    )
    for name, values in tps.items():
        print(
            f"  {name:20s} {statistics.median(values):7.1f} tokens/s  {[round(v) for v in values]}"
        )
    print(f"  same answer on both builds: {len(set(answers.values())) == 1}")
    print(f"  ratio this build / baseline = {this_tps / base_tps:.3f}  (target >= {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
