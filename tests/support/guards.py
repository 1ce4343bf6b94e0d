"""Driving the durable guards: races from several processes (see ``guard_race``), fixed
windows, clients from several loopback addresses."""

from __future__ import annotations

import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from tracker_app.localnet import ManagedProcess, process_env, wait_until


def race_in_processes(
    database_url: str,
    folder: Path,
    op: str,
    value: str,
    *,
    processes: int,
    threads: int,
    times: int,
    now: float,
) -> list[int | bool]:
    """Every result of ``processes`` × ``threads`` contenders, each running ``op`` ``times``
    times against ``database_url``, all released at the same moment (logs in ``folder``)."""
    go_file = folder / "go"
    outs = [folder / f"contender-{index}.json" for index in range(processes)]
    env = process_env(database_url)
    with ExitStack() as stack:
        contenders = []
        for index, out in enumerate(outs):
            argv = [
                sys.executable, "-m", "tests.support.guard_race", op, value,
                str(threads), str(times), str(now), str(go_file), str(out),
            ]  # fmt: skip
            contender = ManagedProcess(
                f"contender-{index}", argv, env=env, log_path=folder / f"contender-{index}.log"
            )
            contenders.append(stack.enter_context(contender))
        for contender, out in zip(contenders, outs, strict=True):
            wait_until(
                out.with_suffix(".ready").exists,
                timeout=120,
                what=f"{contender.name} to set Django up",
                process=contender,
            )
        go_file.touch()
        for contender in contenders:
            assert contender.wait(timeout=120) == 0, contender.output()
    return [result for out in outs for result in json.loads(out.read_text())]


def wait_for_fresh_window(*, window_seconds: int = 60, needed: float = 30.0) -> None:
    """Return with at least ``needed`` seconds left in the current fixed window, sleeping
    into the next one if need be: a test that counts to a limit must not straddle two."""
    left = window_seconds - time.time() % window_seconds
    if left < needed:
        time.sleep(left + 0.2)


def client_from(address: str) -> httpx.Client:
    """An HTTP client whose connections leave from ``address`` (any of 127.0.0.0/8 on
    loopback): how one machine plays several clients to a per-address limit."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30)
