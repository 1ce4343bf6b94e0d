"""200 concurrent streamed chats through one tracker process ÷ the same chats one at a time.

A tracker and two tiny-model nodes (layers 0-1, 2-3) on loopback, the nodes'
session cap above the load unless ``--max-sessions`` says otherwise. Each
distinct prompt is answered once alone first (greedy): every concurrent copy
must equal it, token for token, and be recorded completed and billed once.
Then the chats run all at once twice (a warm-up round, then the measured
one), and the same chats one at a time as the baseline, side by side.

Prints time to first token p50/p99, aggregate tokens/s of both runs and
their ratio, and the tracker's memory (idle before, peak, idle after), with
the targets: aggregate >= 5× one chat alone, TTFT p99 under 2 s, the
tracker's memory back to its baseline after the load (docs/BENCHMARKS.md).
PostgreSQL when DATABASE_URL points at one (a fresh database there), else
SQLite; Redis when REDIS_URL is set, else the embedded mode.

``--tracker-processes 1 2`` runs the whole benchmark once per count, each on
a fresh network whose tracker is ``runtracker --processes N`` (more than 1
needs PostgreSQL and Redis, ADR-0023), and prints their figures side by side;
the tracker's CPU is then reported per server process, its memory for
process 1.

    .venv/bin/python bench/bench_load.py [--chats 200] [--tokens 32] [--max-sessions 256]
        [--tracker-processes N [N ...]]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chat_load import (
    UNLIMITED_KEY,
    Answer,
    LoadFigures,
    LoadRun,
    chat_mix,
    ledger_problems,
    load_client,
    load_problems,
    measured_load,
    run_load,
)
from tracker_app.localnet import LocalNetwork, fresh_process_database

MODEL = "tiny-random-llama"
DISTINCT_PROMPTS = 10
TARGET_RATIO = 5.0
TARGET_TTFT_P99_MS = 2000.0


@dataclass
class Figures:
    run: LoadRun
    baseline: LoadFigures
    one_at_a_time: list[Answer]
    cpu_concurrent: str  # CPU ms per token of each process: lone answers and both rounds
    cpu_one_at_a_time: str
    tracker_cpu_ms_per_token: dict[str, float]  # each tracker process, all at once


def tracker_pids(network: LocalNetwork) -> dict[str, int]:
    """The tracker's serving processes by name: ``tracker``, or with ``--processes N`` the
    supervisor's children, ``tracker 1``… (the supervisor itself only waits)."""
    assert network.tracker is not None
    supervisor = psutil.Process(network.tracker.process.pid)
    children = sorted(child.pid for child in supervisor.children())
    if not children:
        return {"tracker": supervisor.pid}
    return {f"tracker {index}": pid for index, pid in enumerate(children, 1)}


def cpu_seconds(network: LocalNetwork) -> dict[str, float]:
    """CPU time (user + system) each process of the network, and this load client, has
    used so far: on one machine they all share its CPUs."""
    pids = tracker_pids(network)
    pids.update({name: node.process.pid for name, node in network.nodes.items()})
    pids["client"] = os.getpid()
    return {name: sum(psutil.Process(pid).cpu_times()[:2]) for name, pid in pids.items()}


def ms_per_token(
    before: dict[str, float], after: dict[str, float], tokens: int
) -> dict[str, float]:
    return {name: (after[name] - before[name]) * 1000 / tokens for name in before}


def cpu_per_token(before: dict[str, float], after: dict[str, float], tokens: int) -> str:
    """Each process's CPU ms per token, their sum, and the tokens/s that sum allows at most
    on this machine's CPUs (the bound on any aggregate the load can reach here)."""
    each = ms_per_token(before, after, tokens)
    total = sum(each.values())
    cpus = os.cpu_count() or 1
    return (
        ", ".join(f"{name} {ms:.2f}" for name, ms in each.items())
        + f"; all {total:.2f}, so at most {cpus * 1000 / total:.0f} tokens/s on {cpus} CPUs"
    )


async def drive(network: LocalNetwork, key: str, args: argparse.Namespace) -> Figures:
    assert network.tracker is not None
    chats = chat_mix(args.chats, distinct=DISTINCT_PROMPTS, max_tokens=args.tokens)
    headers = {"Authorization": f"Bearer {key}"}
    tracker_pid = next(iter(tracker_pids(network).values()))
    async with load_client(headers, chats=args.chats, timeout=600) as client:
        cpu = [cpu_seconds(network)]
        run = await measured_load(client, network.url, MODEL, chats, tracker_pid=tracker_pid)
        cpu.append(cpu_seconds(network))
        began = time.perf_counter()
        one_at_a_time = await run_load(
            client, f"{network.url}/v1/chat/completions", MODEL, chats, concurrency=1
        )
        baseline = LoadFigures.of(one_at_a_time, time.perf_counter() - began)
        cpu.append(cpu_seconds(network))
    concurrent_tokens = sum(a.completion_tokens or 0 for a in run.every_answer)
    return Figures(
        run=run,
        baseline=baseline,
        one_at_a_time=one_at_a_time,
        cpu_concurrent=cpu_per_token(cpu[0], cpu[1], concurrent_tokens),
        cpu_one_at_a_time=cpu_per_token(cpu[1], cpu[2], args.chats * args.tokens),
        tracker_cpu_ms_per_token={
            name: ms
            for name, ms in ms_per_token(cpu[0], cpu[1], concurrent_tokens).items()
            if name.startswith("tracker")
        },
    )


@dataclass
class Outcome:
    """One count's figures, for the side-by-side summary."""

    processes: int
    figures: Figures
    ratio: float
    problems: int


def report(network: LocalNetwork, key: str, args: argparse.Namespace, processes: int) -> Outcome:
    figures = asyncio.run(drive(network, key, args))
    run, baseline, one_at_a_time = figures.run, figures.baseline, figures.one_at_a_time
    assert network.database_url is not None
    answers = [*run.every_answer, *one_at_a_time]
    problems = load_problems(answers, run.expected)
    problems += ledger_problems(network.database_url, answers)
    database = "PostgreSQL" if network.database_url.startswith("postgres") else "SQLite"
    redis = "Redis" if os.environ.get("REDIS_URL") else "embedded (no Redis)"
    print(
        f"{args.chats} streamed chats, tiny model, {args.tokens} tokens each, "
        f"{DISTINCT_PROMPTS} distinct prompts, node cap {args.max_sessions} sessions; "
        f"{database}, {redis}; tracker processes: {processes}"
    )
    print(f"  all at once:     {run.figures.line()}")
    print(f"  one at a time:   {baseline.line()}")
    ratio = run.figures.tokens_per_second / baseline.tokens_per_second
    print(
        f"  ratio aggregate tokens/s, all at once / one at a time (one chat alone) = {ratio:.2f}"
        f"  (target >= {TARGET_RATIO:g})"
    )
    print(
        f"  TTFT p99 all at once = {run.figures.ttft_p99_ms / 1000:.1f} s"
        f"  (target < {TARGET_TTFT_P99_MS / 1000:g} s)"
    )
    print(f"  CPU ms per token, all at once:   {figures.cpu_concurrent}")
    print(f"  CPU ms per token, one at a time: {figures.cpu_one_at_a_time}")
    for line in run.memory.lines():
        print(f"  {line}")
    print(
        f"  {len(answers)} answers (2 rounds all at once, 1 one at a time) checked against "
        f"the {len(run.expected)} lone greedy answers and the ledger: {len(problems)} problems"
    )
    for problem in problems[:20]:
        print(f"  PROBLEM {problem}")
    return Outcome(processes, figures, ratio, len(problems))


def side_by_side(outcomes: list[Outcome]) -> None:
    """The counts' headline figures in one table (the first count is the reference)."""
    print("\nside by side (all at once; ratio: all at once / one at a time, same tracker):")
    print(
        f"  {'processes':>9} {'tokens/s':>9} {'vs first':>8} {'ratio':>6} "
        f"{'TTFT p50':>9} {'TTFT p99':>9}  tracker CPU ms/token per process"
    )
    reference = outcomes[0].figures.run.figures.tokens_per_second
    for outcome in outcomes:
        run = outcome.figures.run.figures
        cpu = ", ".join(f"{ms:.2f}" for ms in outcome.figures.tracker_cpu_ms_per_token.values())
        print(
            f"  {outcome.processes:>9} {run.tokens_per_second:>9.0f} "
            f"{run.tokens_per_second / reference:>8.2f} {outcome.ratio:>6.2f} "
            f"{run.ttft_p50_ms / 1000:>8.1f}s {run.ttft_p99_ms / 1000:>8.1f}s  {cpu} "
            f"(sum {sum(outcome.figures.tracker_cpu_ms_per_token.values()):.2f})"
        )


def run_one(args: argparse.Namespace, processes: int) -> Outcome:
    """The whole benchmark on a fresh network whose tracker runs ``processes`` processes."""
    cap = ("--max-sessions", str(args.max_sessions))
    with fresh_process_database() as database_url:
        tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
        with LocalNetwork.throwaway(
            workdir=tmp, database_url=database_url, env=UNLIMITED_KEY
        ) as network:
            network.start_tracker(flags=("--processes", str(processes)))
            key = network.create_api_key("bench")
            network.add_node("head", MODEL, (0, 1), extra=cap, wait=False)
            network.add_node("tail", MODEL, (2, 3), extra=cap, wait=False)
            network.wait_for_route(MODEL)
            return report(network, key, args, processes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--max-sessions", type=int, default=256)
    parser.add_argument(
        "--tracker-processes",
        type=int,
        nargs="+",
        default=[1],
        metavar="N",
        help="runtracker --processes N; several counts run one after the other, side by side",
    )
    args = parser.parse_args()
    outcomes = []
    for processes in args.tracker_processes:
        outcomes.append(run_one(args, processes))
        print(flush=True)
    if len(outcomes) > 1:
        side_by_side(outcomes)
    return 1 if any(outcome.problems for outcome in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
