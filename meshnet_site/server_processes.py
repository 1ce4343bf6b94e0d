"""Several server processes behind one listening port, and the supervisor that keeps them.

``runtracker --processes N`` (ADR-0023) binds the port here, in the
supervising process, before any server starts: N listening sockets on the
one port with ``SO_REUSEPORT`` (:meth:`Listener.bind_group`), each with the
backlog ``runtracker`` sets. Server process I inherits socket I and adopts
it (:meth:`Listener.endpoint`, daphne's ``fd:`` endpoint). The kernel
spreads new connections over the sockets by a hash of their addresses, so
a burst of clients splits evenly; one socket that every process accepts
from went mostly to whichever woke first (twisted accepts up to a hundred
connections per wake-up). The supervisor keeps every socket open, so the
connections that reach a process that died wait in its backlog for the
process started in its place: none is refused.

:class:`ServerProcesses` starts the N processes (command lines from its
caller), each with a *lifeline*: one end of a socket pair, on which the
process says ``ready`` once it serves and whose end of file tells it that
the supervisor is gone (it then stops itself, so no server outlives its
supervisor, even one killed outright). The supervisor

- says ready once, when all N serve;
- forwards SIGINT and SIGTERM to each process as SIGTERM, waits for them
  to stop (``STOP_TIMEOUT``, then SIGKILL) and exits 0;
- starts a process that dies after it served ``RESTART_AFTER`` seconds or
  more again (same index, same socket, same tracker id); a process that dies before it
  serves, or sooner after it began serving, stops them all, with its exit
  status: a fault that starting again would only repeat.

Nothing here imports Django: it is plain process supervision.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

READY = b"ready\n"
# A process that dies sooner than this after it began serving is not started again.
RESTART_AFTER = 10.0
# How long the processes get to stop (in-flight streams end) before SIGKILL.
STOP_TIMEOUT = 20.0


@dataclass(frozen=True)
class Listener:
    """A bound, listening socket that a server process inherits and adopts."""

    sock: socket.socket

    @classmethod
    def bind_group(cls, host: str, port: int, count: int, *, backlog: int) -> list[Listener]:
        """``count`` sockets listening on ``host:port`` (its first IPv4 address; port 0: one
        the system chooses) with ``backlog`` each; raises OSError (port in use, no IPv4
        address) here, before any process starts.

        IPv4 only: daphne adopts an inherited socket as IPv4 (its ``fd:`` endpoint
        takes no address family).
        """
        _, kind, proto, _, found = socket.getaddrinfo(
            host, port, family=socket.AF_INET, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        address = (str(found[0]), int(found[1]))
        # A port already in use is refused as without SO_REUSEPORT: a group another
        # program (or another tracker) listens with would take us in, sharing its clients.
        with socket.socket(socket.AF_INET, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
            if port == 0:
                address = (address[0], int(probe.getsockname()[1]))
        group: list[Listener] = []
        try:
            for _ in range(count):
                group.append(cls._listening(kind, proto, address, backlog))
        except OSError:
            for listener in group:
                listener.close()
            raise
        return group

    @classmethod
    def _listening(
        cls, kind: socket.SocketKind, proto: int, address: tuple[str, int], backlog: int
    ) -> Listener:
        sock = socket.socket(socket.AF_INET, kind, proto)
        try:
            # As twisted's own TCP ports: a restarted tracker binds at once.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            sock.listen(backlog)
        except OSError:
            sock.close()
            raise
        return cls(sock)

    @property
    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @staticmethod
    def endpoint(fileno: int) -> str:
        """Daphne's endpoint that adopts an inherited listening IPv4 socket."""
        return f"fd:fileno={fileno}"

    def close(self) -> None:
        self.sock.close()


@dataclass
class ServerProcess:
    """One supervised process: its index (1…N), its process and its lifeline."""

    index: int
    popen: subprocess.Popen[bytes]
    lifeline: socket.socket
    started_at: float
    serving_since: float | None = None
    said: bytes = b""

    @property
    def pid(self) -> int:
        return self.popen.pid


# A process's command line, from its index and the descriptors it inherits:
# the listening socket and its end of the lifeline.
CommandLine = Callable[[int, int, int], Sequence[str]]


@dataclass
class ServerProcesses:
    """Keeps a server process on each of ``listeners`` running; see the module docstring."""

    listeners: list[Listener]
    command_line: CommandLine
    env: Callable[[int], Mapping[str, str]]
    say: Callable[[str], None]
    # Called with a process's pid once it has ended (its bookkeeping, e.g. metrics).
    on_exit: Callable[[int], None] = lambda pid: None
    restart_after: float = RESTART_AFTER
    stop_timeout: float = STOP_TIMEOUT
    processes: dict[int, ServerProcess] = field(default_factory=dict)
    _stop_signal: int | None = None
    _announced: bool = False

    def run(self, on_ready: Callable[[list[int]], None]) -> int:
        """Start the processes; ``on_ready(pids)`` once all serve; return the exit status
        once they have stopped (0 after SIGINT or SIGTERM)."""
        wake_read, wake_write = socket.socketpair()
        wake_write.setblocking(False)
        previous = {
            signum: signal.signal(signum, self._on_signal)
            for signum in (signal.SIGINT, signal.SIGTERM)
        }
        previous_wakeup = signal.set_wakeup_fd(wake_write.fileno())
        selector = selectors.DefaultSelector()
        selector.register(wake_read, selectors.EVENT_READ)
        try:
            for index in range(1, len(self.listeners) + 1):
                self._start(index, selector)
            while self._stop_signal is None:
                for key, _ in selector.select(timeout=1.0):
                    if key.fileobj is wake_read:
                        wake_read.recv(64)
                        continue
                    process = self.processes[key.data]
                    if self._hear(process):
                        continue
                    selector.unregister(process.lifeline)
                    if self._stop_signal is not None:
                        break  # stopping (a Ctrl-C reaches every process): none is restarted
                    failure = self._ended(process, selector)
                    if failure is not None:
                        return failure
                if not self._announced and all(p.serving_since for p in self.processes.values()):
                    self._announced = True
                    on_ready([self.processes[i].pid for i in sorted(self.processes)])
            name = signal.Signals(self._stop_signal).name
            self.say(f"{name}: stopping the {len(self.listeners)} tracker processes")
            return 0
        finally:
            self._stop_all()
            signal.set_wakeup_fd(previous_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            selector.close()
            wake_read.close()
            wake_write.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = signum

    def _start(self, index: int, selector: selectors.BaseSelector) -> ServerProcess:
        ours, theirs = socket.socketpair()
        fds = (self.listeners[index - 1].fileno, theirs.fileno())
        try:
            popen = subprocess.Popen(
                list(self.command_line(index, *fds)), env=dict(self.env(index)), pass_fds=fds
            )
        finally:
            theirs.close()  # the child holds its own copy: its exit closes the lifeline
        process = ServerProcess(index, popen, ours, time.monotonic())
        self.processes[index] = process
        selector.register(ours, selectors.EVENT_READ, data=index)
        return process

    def _hear(self, process: ServerProcess) -> bool:
        """Read what ``process`` said on its lifeline; False at its end (the process ended)."""
        try:
            data = process.lifeline.recv(64)
        except ConnectionError:
            data = b""
        if not data:
            return False
        process.said += data
        if READY in process.said and process.serving_since is None:
            process.serving_since = time.monotonic()
            if self._announced:
                self.say(f"tracker process {process.index} serves again (pid {process.pid})")
        return True

    def _ended(self, process: ServerProcess, selector: selectors.BaseSelector) -> int | None:
        """``process`` closed its lifeline: start it again, or the status to stop all with."""
        status = process.popen.wait()
        process.lifeline.close()
        self.on_exit(process.pid)
        served = 0.0 if process.serving_since is None else time.monotonic() - process.serving_since
        ended = (
            f"was killed by {signal.Signals(-status).name}"
            if status < 0
            else f"exited with status {status}"
        )
        what = f"tracker process {process.index} (pid {process.pid}) {ended}"
        if process.serving_since is None or served < self.restart_after:
            when = (
                "before it served"
                if process.serving_since is None
                else f"{served:.1f} s after it began serving"
            )
            self.say(f"{what} {when}: stopping the tracker")
            return status if status > 0 else 1
        self.say(f"{what} after serving {served:.0f} s: starting it again")
        self._start(process.index, selector)
        return None

    def _stop_all(self) -> None:
        """SIGTERM to every running process, SIGKILL to those still running after the
        stop timeout; returns once all have ended."""
        running = [p for p in self.processes.values() if p.popen.poll() is None]
        for process in running:
            process.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for process in running:
            try:
                process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
        for process in self.processes.values():
            process.lifeline.close()


def lifeline_hold(
    loop: asyncio.AbstractEventLoop, fileno: int, on_supervisor_gone: Callable[[], None]
) -> None:
    """In a server process, once it serves: say ready on the lifeline ``fileno``, and call
    ``on_supervisor_gone`` (on ``loop``) when the supervisor's end closes."""
    os.write(fileno, READY)

    def readable() -> None:
        try:
            data = os.read(fileno, 64)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fileno)
            on_supervisor_gone()

    loop.add_reader(fileno, readable)
