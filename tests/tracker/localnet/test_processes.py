"""The harness (tracker_app.localnet): command lines the commands parse, processes that stop."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes_app.management.commands.runnode import Command as RunNode
from tracker_app.localnet import (
    ROOT,
    LocalNetwork,
    ManagedProcess,
    ProcessExited,
    node_argv,
    process_env,
    tracker_argv,
    wait_until,
    worker_argv,
)
from tracker_app.management.commands.runtracker import Command as RunTracker

# Ignores SIGTERM, starts a child that ignores it too, prints the child's pid, then sleeps.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print("child", child.pid, flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    """The process ended (a zombie waiting for its reaper counts as ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def stubborn(tmp_path: Path) -> tuple[ManagedProcess, int]:
    process = ManagedProcess(
        "stubborn", [sys.executable, "-c", STUBBORN], env=os.environ, log_path=tmp_path / "s.log"
    )
    wait_until(lambda: "child" in process.output(), timeout=20, process=process)
    return process, int(process.output().split()[1])


def test_stop_kills_a_process_that_ignores_sigterm_and_the_children_it_started(
    tmp_path: Path,
) -> None:
    process, child = stubborn(tmp_path)

    status = process.stop(timeout=0.5)

    assert status == -signal.SIGKILL
    assert not process.alive()
    wait_until(lambda: gone(child), what="the child to end")


def test_stop_ends_what_a_process_left_behind_when_it_exited_by_itself(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(600)']); print('child', p.pid, flush=True)"
    )
    process = ManagedProcess(
        "parent", [sys.executable, "-c", code], env=os.environ, log_path=tmp_path / "p.log"
    )
    assert process.wait(timeout=20) == 0
    child = int(process.output().split()[1])
    assert not gone(child)

    process.stop()

    wait_until(lambda: gone(child), what="the orphan to end")


def test_stop_is_harmless_to_repeat_and_keeps_the_output(tmp_path: Path) -> None:
    process = ManagedProcess(
        "sleeper",
        [sys.executable, "-c", "import time; print('hello', flush=True); time.sleep(600)"],
        env=os.environ,
        log_path=tmp_path / "sleeper.log",
    )
    wait_until(lambda: "hello" in process.output(), timeout=20, process=process)

    first = process.stop()
    second = process.stop()

    assert first == second == -signal.SIGTERM
    assert process.output() == "hello\n"


def test_a_signal_reaches_the_process_alone_and_wait_returns_its_status(tmp_path: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *_: sys.exit(3))\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    process = ManagedProcess(
        "polite", [sys.executable, "-c", code], env=os.environ, log_path=tmp_path / "polite.log"
    )
    wait_until(lambda: "ready" in process.output(), timeout=20, process=process)

    process.signal(signal.SIGINT)

    assert process.wait(timeout=20) == 3
    with pytest.raises(ProcessExited, match="polite exited with status 3"):
        process.check_alive()


def test_waiting_on_a_process_that_died_fails_at_once_with_its_output(tmp_path: Path) -> None:
    process = ManagedProcess(
        "doomed",
        [sys.executable, "-c", "print('no weights here'); raise SystemExit(2)"],
        env=os.environ,
        log_path=tmp_path / "doomed.log",
    )

    with pytest.raises(ProcessExited, match="no weights here"):
        wait_until(lambda: False, timeout=60, what="a miracle", process=process)


def parsed_runnode(argv: list[str]) -> dict[str, Any]:
    assert argv[1:3] == [str(ROOT / "manage.py"), "runnode"]
    return vars(RunNode().create_parser("manage.py", "runnode").parse_args(argv[3:]))


def test_the_node_command_line_with_a_tracker_is_what_runnode_parses(tmp_path: Path) -> None:
    argv = node_argv(
        model="tiny-random-llama",
        layers=(2, 3),
        port=7105,
        tracker="http://127.0.0.1:8000",
        host="0.0.0.0",
        threads=2,
        wallet_key=tmp_path / "w.key",
        extra=["--max-sessions", "3"],
    )

    options = parsed_runnode(argv)

    assert options["model"] == "tiny-random-llama"
    assert options["layers"] == (2, 3)
    assert (options["port"], options["host"]) == (7105, "0.0.0.0")
    assert options["tracker"] == "http://127.0.0.1:8000"
    assert (options["threads"], options["device"]) == (2, "cpu")
    assert options["wallet_key"] == tmp_path / "w.key"
    assert options["max_sessions"] == 3


def test_the_node_command_line_without_a_tracker_serves_alone_under_its_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nodes_app.runtime import __main__ as runtime_main

    seen: list[Any] = []

    def run_node(options: Any) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(runtime_main, "run_node", run_node)
    argv = node_argv(model="tiny-random-llama", layers=(0, 1), port=7106, node_id="tiny-head")

    assert argv[1:3] == ["-m", "nodes_app.runtime"]
    assert runtime_main.main(argv[3:]) == 0
    [options] = seen
    assert (options.model, options.start, options.end) == ("tiny-random-llama", 0, 1)
    assert (options.port, options.node_id, options.threads) == (7106, "tiny-head", 1)
    assert options.tracker is None


def test_the_node_command_line_refuses_flags_the_other_command_lacks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="wallet"):
        node_argv(model="m", layers=(0, 1), port=1, wallet_key=tmp_path / "w.key")
    with pytest.raises(ValueError, match="id"):
        node_argv(model="m", layers=(0, 1), port=1, tracker="http://t", node_id="x")


def test_the_tracker_command_line_is_what_runtracker_parses() -> None:
    argv = tracker_argv("127.0.0.1", 8123, "--route-explore-share", "0.1")

    assert argv[1:3] == [str(ROOT / "manage.py"), "runtracker"]
    options = vars(RunTracker().create_parser("manage.py", "runtracker").parse_args(argv[3:]))
    assert (options["host"], options["port"]) == ("127.0.0.1", 8123)
    assert options["route_explore_share"] == 0.1


def test_the_worker_runs_from_any_directory_and_keeps_the_broker_under_var(
    tmp_path: Path,
) -> None:
    # The embedded broker's control folder used to land in the working directory.
    env = process_env(f"sqlite:///{tmp_path}/unused.sqlite3", PYTHONPATH=str(ROOT), REDIS_URL=None)
    argv = worker_argv("--pool", "solo", "--schedule", str(tmp_path / "schedule"))
    with ManagedProcess("worker", argv, env=env, log_path=tmp_path / "w.log", cwd=tmp_path) as w:
        wait_until(lambda: " ready." in w.output(), timeout=60, process=w)

    assert not (tmp_path / "control").exists()
    assert (ROOT / "var" / "celery" / "control" / "celery.exchange").is_file()


def test_a_throwaway_network_serves_on_a_fresh_database_and_stops_with_its_block(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    with LocalNetwork.throwaway(workdir=tmp_path, say=said.append) as network:
        url = network.start_tracker()
        key = network.create_api_key("harness")
        health = httpx.get(f"{url}/healthz")
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"})

    assert health.status_code == 200 and models.json()["data"] == []
    assert key.startswith("mk-")
    assert network.database_url == f"sqlite:///{tmp_path / 'tracker.sqlite3'}"
    assert said and said[0].startswith("started tracker")
    assert network.tracker is not None and not network.tracker.process.alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz")
