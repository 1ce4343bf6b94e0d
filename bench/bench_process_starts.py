"""What a process of a local network costs to start, cold and forked warm (ADR-0030).

The processes the suite starts, one after another through the harness
(``tracker_app.localnet``): a tracker until it answers ``/v1/health``,
``create_api_key`` to its end, a Celery worker until it is ready, a tiny
node until it serves, then all of them stopped. Rounds alternate between
fresh interpreters (cold, as ``meshnet_up`` starts them) and forks of one
``WarmStarter`` (warm, as the suite starts them). The medians of each and
their ratio cold ÷ warm are printed (a report: no target).

PostgreSQL when DATABASE_URL points at one (a fresh database each round),
else SQLite. Run: ``.venv/bin/python bench/bench_process_starts.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tracker_app.localnet import (
    fresh_process_database,
    manage_argv,
    process_env,
    run_checked,
    start_node,
    start_tracker,
    start_worker,
    stop_together,
    wait_until,
)
from tracker_app.localnet.warm_start import warm_starter

STEPS = ("tracker", "create_api_key", "worker", "node", "stop all")


def timed(times: dict[str, list[float]], step: str, work: Callable[[], object]) -> None:
    began = time.monotonic()
    work()
    times[step].append(time.monotonic() - began)


def one_round(times: dict[str, list[float]], workdir: Path) -> None:
    with fresh_process_database() as database_url:
        env = process_env(database_url)
        tracker = start_tracker(env=env, log_dir=workdir)
        timed(times, "tracker", tracker.wait_healthy)
        timed(
            times,
            "create_api_key",
            lambda: run_checked(manage_argv("create_api_key", "b"), env=env),
        )
        worker = start_worker(env=env, log_dir=workdir, extra=("--pool", "solo"))
        timed(
            times, "worker", lambda: wait_until(lambda: " ready." in worker.output(), timeout=120)
        )
        node = start_node(
            name="bench", model="tiny-random-llama", layers=(0, 3), env=env,
            log_dir=workdir, node_id="bench", dev_open=True,
        )  # fmt: skip
        timed(times, "node", node.wait_serving)
        processes = [worker, node.process, tracker.process]
        timed(times, "stop all", lambda: stop_together(processes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="process-starts-"))
    kinds: dict[str, Callable[[], AbstractContextManager[object]]] = {
        "cold": nullcontext,
        "warm": lambda: warm_starter(process_env(), workdir),
    }
    times: dict[str, dict[str, list[float]]] = {kind: {s: [] for s in STEPS} for kind in kinds}
    for _ in range(args.rounds):
        for kind, context in kinds.items():
            with context():
                one_round(times[kind], workdir)
    print(f"{'step':16} {'cold s':>8} {'warm s':>8} {'cold ÷ warm':>12}")
    totals = {kind: 0.0 for kind in kinds}
    for step in STEPS:
        cold, warm = (statistics.median(times[kind][step]) for kind in kinds)
        totals["cold"] += cold
        totals["warm"] += warm
        print(f"{step:16} {cold:8.2f} {warm:8.2f} {cold / warm:12.2f}")
    print(f"{'all':16} {totals['cold']:8.2f} {totals['warm']:8.2f} "
          f"{totals['cold'] / totals['warm']:12.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
