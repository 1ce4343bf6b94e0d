"""Processes forked from a warm starter (ADR-0030) are the commands they were asked to be:
what each sees and shows, its signals and its exit status, as a cold start gives them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.tracker.localnet.test_processes import gone
from tracker_app.localnet import ROOT, ManagedProcess, process_env, run_command, wait_until
from tracker_app.localnet.warm_start import WarmStarter, warm_starter

CHILD = [sys.executable, "-m", "tests.support.warm_child"]
# A setting read as an interpreter starts, unlike the starter's: that command starts cold.
STARTS = {"warm": {}, "cold": {"OMP_NUM_THREADS": "2"}}


@pytest.fixture(scope="module")
def starter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmStarter]:
    with warm_starter(process_env(), tmp_path_factory.mktemp("starter")) as started:
        yield started


def parent(starter: WarmStarter, start: str) -> int:
    return starter.pid if start == "warm" else os.getpid()


def child(tmp_path: Path, start: str, *args: str) -> ManagedProcess:
    env = process_env(PROBE="asked", **STARTS[start])
    return ManagedProcess("child", [*CHILD, *args], env=env, log_path=tmp_path / "child.log")


def running_child(tmp_path: Path, start: str, mode: str, printed: str) -> ManagedProcess:
    """A ``mode`` child, once it has printed ``printed``."""
    process = child(tmp_path, start, mode)
    wait_until(lambda: printed in process.output(), timeout=60, process=process)
    return process


@pytest.mark.parametrize("start", STARTS)
def test_a_command_gets_its_own_session_directory_environment_output_and_exit_status(
    starter: WarmStarter, tmp_path: Path, start: str
) -> None:
    process = child(tmp_path, start, "report", "3")

    assert process.wait(timeout=60) == 3
    out = process.output()
    report = json.loads(out.splitlines()[0])
    assert report["ppid"] == parent(starter, start)
    assert report["pid"] == report["sid"] == process.pid
    assert (report["cwd"], report["probe"]) == (str(ROOT), "asked")
    assert report["argv"][1:] == ["report", "3"]
    assert "to stderr" in out
    # As an interpreter exits: its threads joined, then its exit functions run.
    assert out.index("thread done") < out.index("atexit ran")


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize(
    ("mode", "printed"),
    [("message", "a message for the operator"), ("raise", "RuntimeError: boom")],
)
def test_a_command_that_fails_exits_with_status_1_and_says_why(
    starter: WarmStarter, tmp_path: Path, start: str, mode: str, printed: str
) -> None:
    process = child(tmp_path, start, mode)

    assert process.wait(timeout=60) == 1
    assert printed in process.output()


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_a_command_as_it_ends_an_interpreter(
    starter: WarmStarter, tmp_path: Path, start: str, signum: int
) -> None:
    process = running_child(tmp_path, start, "wait", "waiting")

    process.signal(signum)

    assert process.wait(timeout=30) == -signum
    assert ("KeyboardInterrupt" in process.output()) is (signum == signal.SIGINT)


@pytest.mark.parametrize("start", STARTS)
def test_stop_kills_a_command_that_ignores_sigterm_and_what_it_started(
    starter: WarmStarter, tmp_path: Path, start: str
) -> None:
    process = running_child(tmp_path, start, "stubborn", "child")
    grandchild = int(process.output().split()[1])

    assert process.stop(timeout=0.5) == -signal.SIGKILL
    wait_until(lambda: gone(grandchild), what="the command's own child to end")


@pytest.mark.parametrize("start", STARTS)
def test_a_one_shot_command_answers_its_status_and_each_stream(
    starter: WarmStarter, start: str
) -> None:
    env = process_env(PROBE="asked", **STARTS[start])

    done = run_command([*CHILD, "report", "4"], env=env, timeout=60)

    assert done.returncode == 4
    assert json.loads(done.stdout.splitlines()[0])["ppid"] == parent(starter, start)
    assert done.stdout.splitlines()[1:] == ["thread done", "atexit ran"]
    assert done.stderr == "to stderr\n"


@pytest.mark.parametrize("start", STARTS)
def test_a_one_shot_command_past_its_timeout_is_killed(
    starter: WarmStarter, tmp_path: Path, start: str
) -> None:
    pid_file = tmp_path / "pid"
    env = process_env(PID_FILE=str(pid_file), **STARTS[start])

    with pytest.raises(subprocess.TimeoutExpired):
        run_command([*CHILD, "wait"], env=env, timeout=5)
    wait_until(lambda: gone(int(pid_file.read_text())), what="the command to end")


@pytest.mark.parametrize("start", STARTS)
def test_a_command_one_thread_waits_for_is_polled_by_another_without_blocking(
    starter: WarmStarter, tmp_path: Path, start: str
) -> None:
    process = running_child(tmp_path, start, "wait", "waiting")
    with ThreadPoolExecutor(1) as pool:
        waited = pool.submit(process.wait, 60)
        time.sleep(0.2)  # the other thread is now waiting

        began = time.monotonic()
        assert process.alive()
        assert time.monotonic() - began < 1

        process.signal(signal.SIGTERM)
        assert waited.result() == -signal.SIGTERM
    assert process.returncode == -signal.SIGTERM
