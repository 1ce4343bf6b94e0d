"""The processes of a local network: their command lines, and a process that stops cleanly.

This is the one place that builds a ``runtracker``, worker or node command
line and the one place that ends a process: ``meshnet_up``, the test
fixtures and the benchmarks all come here. It imports neither Django nor
torch, so a benchmark or a test helper can use it without settings.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from tracker_app.localnet import warm_start

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
STOP_TIMEOUT = 20.0


class ProcessExited(RuntimeError):
    """A process of the network ended while it was still needed."""


def manage_argv(command: str, *args: str) -> list[str]:
    """``python manage.py COMMAND ARGS…`` with this interpreter and this checkout."""
    return [sys.executable, str(ROOT / "manage.py"), command, *args]


def tracker_argv(host: str, port: int, *flags: str) -> list[str]:
    """``manage.py runtracker`` on ``host:port``; ``flags`` are runtracker's own (routing)."""
    return manage_argv("runtracker", "--host", host, "--port", str(port), *flags)


def worker_argv(*extra: str) -> list[str]:
    """The Celery worker with its beat scheduler embedded, as DESIGN.md starts it."""
    return [
        sys.executable, "-m", "celery", "-A", "meshnet_site", "worker", "-B",
        "--loglevel", "INFO", *extra,
    ]  # fmt: skip


def node_argv(
    *,
    model: str,
    layers: tuple[int, int],
    port: int,
    tracker: str | None = None,
    host: str = LOOPBACK,
    threads: int | None = 1,
    device: str = "cpu",
    wallet_key: Path | None = None,
    node_id: str | None = None,
    dev_open: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """A node serving layers ``layers`` (inclusive) of ``model`` on ``host:port``.

    With ``tracker`` it is ``manage.py runnode``, which registers and
    heartbeats (its wallet at ``wallet_key``, or runnode's default). Without
    one it is ``python -m nodes_app.runtime``, which serves alone under
    ``node_id``. ``dev_open`` (tests and benchmarks that call a node
    directly, never a node joined to a tracker in a test of the real checks)
    makes it serve unsigned plans. ``threads=None`` leaves the thread count to
    torch; ``extra`` are further flags of either command. Raises ValueError for a wallet
    without a tracker or a node id with one: the other command has no such flag.
    """
    common = [
        "--model", model, "--layers", f"{layers[0]}-{layers[1]}", "--port", str(port),
        "--host", host, "--device", device,
    ]  # fmt: skip
    if threads is not None:
        common += ["--threads", str(threads)]
    if dev_open:
        common.append("--dev-open")
    if tracker is None:
        if wallet_key is not None:
            raise ValueError("a node without a tracker has no wallet")
        named = [] if node_id is None else ["--node-id", node_id]
        return [sys.executable, "-m", "nodes_app.runtime", *common, *named, *extra]
    if node_id is not None:
        raise ValueError("a node joined to a tracker gets its id from the tracker")
    wallet = [] if wallet_key is None else ["--wallet-key", str(wallet_key)]
    return manage_argv("runnode", *common, "--tracker", tracker, *wallet, *extra)


def run_command(
    argv: Sequence[str], *, env: Mapping[str, str], timeout: float = 300.0
) -> subprocess.CompletedProcess[str]:
    """Run a one-shot command (``migrate``, ``create_api_key``…) to its end, output captured.

    The result is returned whatever the exit status; callers that need
    success use :func:`run_checked`.
    """
    return warm_start.run(argv, cwd=ROOT, env=env, timeout=timeout)


def run_checked(argv: Sequence[str], *, env: Mapping[str, str], timeout: float = 300.0) -> str:
    """Run a one-shot command and return its stdout; raises ProcessExited with its output."""
    result = run_command(argv, env=env, timeout=timeout)
    if result.returncode != 0:
        raise ProcessExited(
            f"{' '.join(argv[1:3])} exited with status {result.returncode}:\n"
            f"{result.stdout}{result.stderr}"
        )
    return result.stdout


class ManagedProcess:
    """A long-running process in a process group of its own, its output in a log file.

    Being a group leader, whatever it starts (Celery's pool and beat) ends
    with it, and a Ctrl-C at the terminal of whoever started it does not
    reach it: its owner decides when it stops.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path = ROOT,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._stopped = False
        self._terminated = False
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # The child keeps its own copy of the descriptor; ours is not needed.
        with log_path.open("wb") as log:
            self._popen = warm_start.start(self.argv, cwd=cwd, env=env, log=log)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has ended, else None."""
        return self._popen.poll()

    def alive(self) -> bool:
        return self._popen.poll() is None

    def output(self) -> str:
        """Everything the process printed so far (stdout and stderr together)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process alone, as an operator's ``kill`` or Ctrl-C would."""
        if self.alive():
            self._popen.send_signal(signum)

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; raises TimeoutError if it still runs after ``timeout`` seconds."""
        try:
            return self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name} still runs after {timeout} s") from None

    def check_alive(self) -> None:
        """Raise ProcessExited, naming the log, if the process has ended."""
        if not self.alive():
            raise ProcessExited(
                f"{self.name} exited with status {self.returncode}; see {self.log_path}"
            )

    def kill(self) -> int:
        """End the process group at once (SIGKILL), as a crash would; returns the status."""
        self._signal_group(signal.SIGKILL)
        return self._popen.wait()

    def terminate(self) -> None:
        """SIGTERM to the process alone, once: it begins its own shutdown (see :meth:`stop`).

        A second SIGTERM would make some servers (uvicorn) give up their
        graceful shutdown, so a process already told is not told again.
        """
        if not self._terminated and self._popen.poll() is None:
            self._terminated = True
            self._popen.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, then SIGKILL to the whole group after ``timeout`` seconds; the status.

        SIGTERM goes to the process alone, so that it shuts down its own
        way (Celery's warm shutdown lets its pool finish the running task);
        whatever it leaves running in its group is killed once it has ended.
        Calling it again, or after the process ended by itself, is harmless.
        """
        returncode = self._popen.poll()
        if returncode is None:
            self.terminate()
            try:
                returncode = self._popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                returncode = self._popen.wait()
        if not self._stopped:
            self._stopped = True
            self._signal_group(signal.SIGKILL)
        return returncode

    def _signal_group(self, signum: int) -> None:
        # The group outlives its leader while any member runs; once the last
        # member is gone there is no group to signal.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signum)

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<ManagedProcess {self.name} pid {self.pid}>"


def stop_together(processes: Iterable[ManagedProcess], timeout: float = STOP_TIMEOUT) -> None:
    """Stop ``processes`` side by side: each is told (SIGTERM) before any is waited for,
    then each is stopped as :meth:`ManagedProcess.stop` does, within one shared ``timeout``.

    Their graceful shutdowns (a node deregistering) overlap instead of adding up.
    """
    processes = list(processes)
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + timeout
    for process in processes:
        process.stop(max(deadline - time.monotonic(), 0.0))


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on right now (the OS's choice)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float = 30.0,
    what: str = "a condition",
    interval: float = 0.05,
    process: ManagedProcess | None = None,
) -> None:
    """Return once ``condition()`` is true; raises TimeoutError after ``timeout`` seconds.

    The default deadline is one for every wait on another process's state: a
    condition met returns at once, so a deadline sized for a loaded, slower
    machine costs a passing wait nothing.

    A poll that times out (``httpx.TimeoutException``: what it asks is too
    busy to answer yet, as a node mid-step on a slow machine) counts as
    false until the deadline. With ``process``, raises ProcessExited (with
    its output) as soon as that process ends, instead of waiting out the
    timeout.
    """
    deadline = time.monotonic() + timeout

    def met() -> bool:
        try:
            return condition()
        except httpx.TimeoutException:
            if time.monotonic() > deadline:
                raise
            return False

    while not met():
        if process is not None and not process.alive():
            raise ProcessExited(
                f"{process.name} exited with status {process.returncode} while waiting for "
                f"{what}:\n{process.output()}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting {timeout:.0f} s for {what}")
        time.sleep(interval)


def wait_for_port(
    host: str, port: int, *, timeout: float = 30.0, process: ManagedProcess | None = None
) -> None:
    """Return once something accepts TCP connections on ``host:port`` (see :func:`wait_until`)."""

    def listening() -> bool:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False

    wait_until(listening, timeout=timeout, what=f"{host}:{port} to listen", process=process)
