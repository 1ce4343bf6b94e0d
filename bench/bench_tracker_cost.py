"""What the tracker process itself costs: CPU ms per chat before its first token, per relayed token.

A tracker and two tiny-model nodes (layers 0-1, 2-3) on loopback, as
``bench_load.py`` starts them. Lone streamed chats, one at a time, each on a
connection of its own (as separate clients): ``--chats`` of 1 token and as
many of 64 tokens (greedy), in alternating blocks. The tracker process's CPU
time (user + system, all its threads, from /proc) is read around each block:

- CPU ms per chat before its first token: a 1-token chat's whole cost, minus
  nothing (request handling, key, limits, prompt count, route, plan, records,
  billing, events, the one token and the end);
- CPU ms per relayed token: the slope between the two, (CPU of the 64-token
  chats - CPU of the 1-token chats) / (their tokens' difference).

Then the same requests straight from the head (``/v1/generate``, a plan
signed as the tracker signs one) for comparison: wall ms per chat and per
token both ways, and the head's CPU per token both ways (what a node spends
beside what the tracker spends). Last, ``--concurrent`` 64-token chats at
once: the tracker's CPU ms per relayed token when many streams share it.
Every answer through the tracker must be the lone greedy answer of its
prompt and be recorded completed and billed once (``chat_load.ledger_problems``).

Targets: <= 5 ms per chat, <= 0.3 ms per token.
PostgreSQL when DATABASE_URL points at one (a fresh database there), else
SQLite; Redis when REDIS_URL is set, else the embedded mode.
``--profile DIR`` also records the tracker with py-spy (``--format raw``:
collapsed stacks) during the lone chats and during the concurrent ones, and
prints each profile's top frames.

    .venv/bin/python bench/bench_tracker_cost.py [--chats 40] [--concurrent 64] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chat_load import (
    UNLIMITED_KEY,
    Answer,
    Chat,
    answer_take,
    ledger_problems,
    load_client,
    load_problems,
    run_load,
)
from bench.signed_plans import signed_direct
from nodes_app.protocol.sse import sse_data
from tracker_app.localnet import LocalNetwork, fresh_process_database

MODEL = "tiny-random-llama"
LONG = 64  # tokens of the long chats
TARGET_CHAT_MS = 5.0
TARGET_TOKEN_MS = 0.3
PROMPTS = [f"Tell me about mesh number {i}." for i in range(4)]
PY_SPY = Path(sys.executable).parent / "py-spy"


def cpu_s(pid: int) -> float:
    """The CPU seconds (user + system, every thread) process ``pid`` has used so far."""
    return float(sum(psutil.Process(pid).cpu_times()[:2]))


@dataclass
class Block:
    """Lone chats of one length, one way (through the tracker or straight from the head)."""

    chats: int = 0
    tokens: int = 0
    tracker_cpu_s: float = 0.0
    head_cpu_s: float = 0.0
    wall_s: float = 0.0

    def add(self, other: Block) -> None:
        self.chats += other.chats
        self.tokens += other.tokens
        self.tracker_cpu_s += other.tracker_cpu_s
        self.head_cpu_s += other.head_cpu_s
        self.wall_s += other.wall_s


def slope(short: Block, long: Block, field: str) -> float:
    """ms per token between the short and the long chats of ``field`` (seconds)."""
    extra_tokens = long.tokens / long.chats - short.tokens / short.chats
    extra = getattr(long, field) / long.chats - getattr(short, field) / short.chats
    return extra * 1000 / extra_tokens


def streamed_tokens(response: httpx.Response) -> int:
    """The completion tokens a stream's usage reports (0 when it has none)."""
    tokens = 0
    for line in response.iter_lines():
        frame = sse_data(line)
        if isinstance(frame, dict) and frame.get("usage"):
            tokens = int(frame["usage"]["completion_tokens"])
    return tokens


class Bench:
    def __init__(self, network: LocalNetwork, key: str) -> None:
        assert network.tracker is not None
        self.network = network
        self.tracker_pid = network.tracker.process.pid
        head = network.nodes["head"]
        self.head_pid = head.process.pid
        self.head_url = head.endpoint
        self.hops = [head.hop(), network.nodes["tail"].hop()]
        self.auth = {"Authorization": f"Bearer {key}"}
        # No kept-alive connection: each chat comes on a connection of its own.
        self.client = httpx.Client(timeout=120, limits=httpx.Limits(max_keepalive_connections=0))
        self.answers: list[Answer] = []

    def body(self, prompt: str, tokens: int) -> dict[str, Any]:
        return {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": tokens,
            "temperature": 0,
        }

    def tracker_chat(self, prompt: str, tokens: int) -> int:
        """One streamed chat through the tracker, read as ``chat_load`` reads one."""
        chat = Chat(prompt, tokens)
        answer = Answer(chat)
        url = f"{self.network.url}/v1/chat/completions"
        began = time.perf_counter()
        with self.client.stream("POST", url, json=chat.body(MODEL), headers=self.auth) as response:
            answer.status = response.status_code
            for line in response.iter_lines():
                answer_take(answer, sse_data(line), began)
        answer.elapsed_s = time.perf_counter() - began
        self.answers.append(answer)
        return answer.completion_tokens or 0

    def direct_chat(self, prompt: str, tokens: int) -> int:
        assert self.network.tracker_key_file is not None
        body = signed_direct(
            {**self.body(prompt, tokens), "plan": {"model": MODEL, "hops": self.hops}},
            self.network.tracker_key_file,
        )
        with self.client.stream("POST", f"{self.head_url}/v1/generate", json=body) as response:
            response.raise_for_status()
            return streamed_tokens(response)

    def block(self, tokens: int, chats: int, *, direct: bool) -> Block:
        """``chats`` lone chats of ``tokens`` tokens, one at a time."""
        one = self.direct_chat if direct else self.tracker_chat
        tracker, head = cpu_s(self.tracker_pid), cpu_s(self.head_pid)
        began = time.perf_counter()
        produced = sum(one(PROMPTS[i % len(PROMPTS)], tokens) for i in range(chats))
        return Block(
            chats=chats,
            tokens=produced,
            wall_s=time.perf_counter() - began,
            tracker_cpu_s=cpu_s(self.tracker_pid) - tracker,
            head_cpu_s=cpu_s(self.head_pid) - head,
        )

    def concurrent(self, chats: int) -> tuple[Block, list[Answer]]:
        tracker = cpu_s(self.tracker_pid)
        began = time.perf_counter()
        answers = asyncio.run(self._all_at_once(chats))
        block = Block(
            chats=chats,
            tokens=sum(a.completion_tokens or 0 for a in answers),
            wall_s=time.perf_counter() - began,
            tracker_cpu_s=cpu_s(self.tracker_pid) - tracker,
        )
        return block, answers

    async def _all_at_once(self, chats: int) -> list[Answer]:
        mix = [Chat(PROMPTS[i % len(PROMPTS)], LONG) for i in range(chats)]
        async with load_client(self.auth, chats=chats, timeout=600) as client:
            return await run_load(client, f"{self.network.url}/v1/chat/completions", MODEL, mix)


@contextmanager
def profiled(pid: int, path: Path | None) -> Iterator[None]:
    """py-spy records ``pid`` into ``path`` (collapsed stacks) while the block runs."""
    if path is None:
        yield
        return
    spy = subprocess.Popen(
        [str(PY_SPY), "record", "--pid", str(pid), "--rate", "500", "--format", "raw",
         "--output", str(path), "--nonblocking", "--gil"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)  # attached
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)


OWN_CODE = ("tracker_app/", "routing_app/", "meshnet_site/", "nodes_app/")


def top_frames(path: Path, count: int = 20) -> list[str]:
    """What the samples of ``path`` (py-spy's raw output, taken holding the GIL: the
    tracker's Python CPU) were spent in: the own-code functions they pass through
    (inclusive), and the functions they were in (self), each as a share of all samples."""
    inclusive: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, weight = line.rpartition(" ")
        frames = [frame for frame in stack.split(";") if "(" in frame]
        if not frames:
            continue
        total += int(weight)
        leaves[frames[-1]] += int(weight)
        for frame in set(frames):
            if any(code in frame for code in OWN_CODE):
                inclusive[frame] += int(weight)
    share = max(total, 1) / 100
    return (
        [f"{total} samples; own code, inclusive:"]
        + [f"  {n / share:5.1f}%  {frame}" for frame, n in inclusive.most_common(count)]
        + ["self:"]
        + [f"  {n / share:5.1f}%  {frame}" for frame, n in leaves.most_common(count)]
    )


def report(network: LocalNetwork, key: str, args: argparse.Namespace) -> int:
    bench = Bench(network, key)
    profile_dir: Path | None = args.profile
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    for prompt in PROMPTS:  # the lone greedy answers, and warm: each path, each length
        for tokens in (1, LONG):
            bench.tracker_chat(prompt, tokens)
            bench.direct_chat(prompt, tokens)
    expected = {chat: answer for answer in bench.answers for chat in [answer.chat]}
    bench.answers.clear()
    rounds = args.rounds
    each = max(1, args.chats // rounds)
    ways = {"tracker": False, "direct": True}
    sums = {(way, t): Block() for way in ways for t in (1, LONG)}
    with profiled(bench.tracker_pid, profile_dir / "lone.txt" if profile_dir else None):
        for _ in range(rounds):
            for way, direct in ways.items():
                for tokens in (1, LONG):
                    sums[way, tokens].add(bench.block(tokens, each, direct=direct))
    with profiled(bench.tracker_pid, profile_dir / "concurrent.txt" if profile_dir else None):
        together, together_answers = bench.concurrent(args.concurrent)
    lone_answers = list(bench.answers)
    assert network.database_url is not None
    problems = load_problems([*lone_answers, *together_answers], expected)
    problems += ledger_problems(network.database_url, [*lone_answers, *together_answers])

    database = "PostgreSQL" if network.database_url.startswith("postgres") else "SQLite"
    redis = "Redis" if os.environ.get("REDIS_URL") else "embedded (no Redis)"
    short, long = sums["tracker", 1], sums["tracker", LONG]
    d_short, d_long = sums["direct", 1], sums["direct", LONG]
    per_chat = short.tracker_cpu_s * 1000 / short.chats
    per_token = slope(short, long, "tracker_cpu_s")
    print(
        f"Tracker CPU per chat and per token: tiny model, 2 nodes (0-1, 2-3), lone streamed "
        f"chats one at a time on fresh connections, {short.chats} of 1 token and {long.chats} of "
        f"{LONG} (greedy) each way in {rounds} alternating rounds; {database}, {redis}"
    )
    print(
        f"  tracker CPU ms per chat before its first token (1-token chats) = {per_chat:.2f}"
        f"  (target <= {TARGET_CHAT_MS:g})"
    )
    print(
        f"  tracker CPU ms per relayed token (slope 1 -> {LONG} tokens)   = {per_token:.3f}"
        f"  (target <= {TARGET_TOKEN_MS:g})"
    )
    print(
        f"  wall ms per 1-token chat:   through tracker {short.wall_s * 1000 / short.chats:.1f}, "
        f"straight from head {d_short.wall_s * 1000 / d_short.chats:.1f}"
    )
    print(
        f"  wall ms per token (slope):  through tracker {slope(short, long, 'wall_s'):.2f}, "
        f"straight from head {slope(d_short, d_long, 'wall_s'):.2f}"
    )
    print(
        f"  head CPU ms per chat / per token: through tracker "
        f"{short.head_cpu_s * 1000 / short.chats:.1f} / {slope(short, long, 'head_cpu_s'):.2f}, "
        f"straight from head {d_short.head_cpu_s * 1000 / d_short.chats:.1f} / "
        f"{slope(d_short, d_long, 'head_cpu_s'):.2f}"
    )
    per_token_together = together.tracker_cpu_s * 1000 / max(together.tokens, 1)
    print(
        f"  {together.chats} chats of {LONG} tokens at once: tracker CPU ms per token "
        f"(chat costs included) = {per_token_together:.3f}, {together.tokens} tokens in "
        f"{together.wall_s:.1f} s ({together.tokens / together.wall_s:.0f} tokens/s)"
    )
    print(
        f"  {len(lone_answers) + len(together_answers)} answers checked against the lone greedy "
        f"answers and the ledger: {len(problems)} problems"
    )
    for problem in problems[:20]:
        print(f"  PROBLEM {problem}")
    if profile_dir is not None:
        for name in ("lone", "concurrent"):
            print(f"  py-spy --gil, {name} chats:")
            for line in top_frames(profile_dir / f"{name}.txt"):
                print(f"    {line}")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=40, help="lone chats of each kind")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds")
    parser.add_argument("--concurrent", type=int, default=64)
    parser.add_argument("--profile", type=Path, default=None, help="py-spy profiles here")
    args = parser.parse_args()
    with fresh_process_database() as database_url:
        tmp = Path(tempfile.mkdtemp(prefix="bench-tracker-cost-"))
        cap = ("--max-sessions", "256")
        with LocalNetwork.throwaway(
            workdir=tmp, database_url=database_url, env=UNLIMITED_KEY
        ) as network:
            network.start_tracker()
            key = network.create_api_key("bench")
            network.add_node("head", MODEL, (0, 1), extra=cap, wait=False)
            network.add_node("tail", MODEL, (2, 3), extra=cap, wait=False)
            network.wait_for_route(MODEL)
            return report(network, key, args)


if __name__ == "__main__":
    sys.exit(main())
