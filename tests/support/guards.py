"""Racing the durable guards from several processes at once (see ``guard_race``)."""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack
from pathlib import Path

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
