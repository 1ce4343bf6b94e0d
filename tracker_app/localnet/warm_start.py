"""Python processes forked from a warm interpreter instead of started cold (ADR-0030).

A node's interpreter spends about 5 s of CPU importing torch and
transformers before it runs a line of Meshnet, and a test suite starts
hundreds of them. A :class:`WarmStarter` is a server process that imports
those libraries once (:data:`PRELOADED`; of Meshnet's, only this harness) and
forks each process it is asked for, from a Unix socket. The child becomes
the asked-for command: its own session, working directory, environment and
log, then ``-m MODULE`` or ``manage.py`` run as ``__main__`` by runpy, and
the interpreter's own exit. Its parent is the starter, which reports its
exit status back over the connection that asked for it.

:func:`start` is what :class:`~tracker_app.localnet.processes.ManagedProcess`
and :func:`~tracker_app.localnet.processes.run_command` call: with no starter
in use (the default), or for a command a fork cannot become faithfully
(see :meth:`WarmStarter.can_start`), it is :class:`subprocess.Popen`.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]

# Third-party libraries only: importing them reads no Meshnet setting, starts
# no thread and opens no socket. Django is imported but never set up.
PRELOADED = (
    "torch",
    "transformers",
    "transformers.core_model_loading",
    "transformers.masking_utils",
    "transformers.models.llama.modeling_llama",
    "safetensors.torch",
    "tokenizers",
    "jinja2",
    "llguidance",
    "numpy",
    "httpx",
    "uvicorn",
    "starlette.applications",
    "psycopg",
    "redis",
    "django",
    "django.core.management",
    "django.db.models",
)

# What the interpreter and the preloaded libraries read as they start: a command
# whose environment differs here is started cold.
_READ_AT_START = (
    "PYTHON",
    "OMP_",
    "OPENBLAS_",
    "MKL_",
    "HF_",
    "TRANSFORMERS_",
    "TORCH",
    "TOKENIZERS",
)
_MAIN = (sys.executable, "-m")
_MANAGE = (sys.executable, str(ROOT / "manage.py"))
_POLL_SECONDS = 0.05


class WarmChild:
    """A process the starter forked, seen from the process that asked for it.

    It answers as much of :class:`subprocess.Popen` as the harness uses:
    ``pid``, ``returncode``, ``poll``, ``wait`` and ``send_signal``.
    """

    def __init__(self, connection: socket.socket, pid: int) -> None:
        self._connection = connection
        self._reading = threading.Lock()
        self._pending = b""
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(timeout=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            self._read(timeout=left)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def _read(self, *, timeout: float | None) -> None:
        """Take the status if the starter has sent it within ``timeout`` seconds (None:
        until it does). Another thread already waiting for it counts against the time."""
        if not self._reading.acquire(timeout=-1 if timeout is None else timeout):
            return
        try:
            if self.returncode is not None:
                return
            self._connection.settimeout(timeout)
            try:
                data = self._connection.recv(4096)
            except (BlockingIOError, TimeoutError):
                return
            self._take(data)
        finally:
            self._reading.release()

    def _take(self, data: bytes) -> None:
        if not data:
            raise RuntimeError(f"the warm starter went away before process {self.pid} ended")
        self._pending += data
        if b"\n" in self._pending:
            self.returncode = int(json.loads(self._pending.split(b"\n", 1)[0])["returncode"])
            self._connection.close()


class WarmStarter:
    """A running starter (``python -m tracker_app.localnet.warm_start SOCKET``) and its
    clients' side: :meth:`start` asks it for a process."""

    def __init__(self, env: Mapping[str, str], workdir: Path) -> None:
        self.env = dict(env)
        self.socket_path = workdir / "warm-start.sock"
        self.socket_path.unlink(missing_ok=True)  # an earlier starter's
        with (workdir / "warm-start.log").open("wb") as log:
            self._server = subprocess.Popen(
                [sys.executable, "-m", __name__, str(self.socket_path)],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 120
        while not self.socket_path.exists():
            if self._server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the warm starter did not start; see {workdir}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        """The starter's process: the parent of every process it forks."""
        return self._server.pid

    def can_start(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> bool:
        """Whether a fork becomes exactly this command: this interpreter running a module
        (``-m``) or ``manage.py`` in the checkout, with the settings read at start
        (:data:`_READ_AT_START`) the starter itself started with."""
        runnable = tuple(argv[:2]) == _MANAGE or (tuple(argv[:2]) == _MAIN and len(argv) > 2)
        return runnable and cwd == ROOT and _read_at_start(env) == _read_at_start(self.env)

    def start(
        self, argv: Sequence[str], *, env: Mapping[str, str], stdout: Path, stderr: Path
    ) -> WarmChild:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(str(self.socket_path))
        request = {
            "argv": list(argv), "env": dict(env), "stdout": str(stdout), "stderr": str(stderr),
        }  # fmt: skip
        connection.sendall(json.dumps(request).encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = connection.recv(4096)
            if not chunk:
                raise RuntimeError("the warm starter refused to start " + " ".join(argv[1:3]))
            reply += chunk
        return WarmChild(connection, int(json.loads(reply)["pid"]))

    def close(self) -> None:
        """End the starter; the processes it started run on, as Popen's children would."""
        self._server.terminate()
        self._server.wait()
        self.socket_path.unlink(missing_ok=True)


_in_use: WarmStarter | None = None


@contextlib.contextmanager
def warm_starter(env: Mapping[str, str], workdir: Path) -> Iterator[WarmStarter]:
    """Start this process's later Python processes from a starter with ``env``; the one in
    use before (if any) is in use again after."""
    global _in_use
    before, starter = _in_use, WarmStarter(env, workdir)
    _in_use = starter
    try:
        yield starter
    finally:
        _in_use = before
        starter.close()


def start(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: IO[bytes]
) -> subprocess.Popen[bytes] | WarmChild:
    """Start ``argv`` with stdout and stderr in ``log``, in a session of its own: forked
    from the starter in use where it can become the command, else a fresh interpreter."""
    if _in_use is not None and _in_use.can_start(argv, env, cwd):
        path = Path(log.name)
        return _in_use.start(argv, env=env, stdout=path, stderr=path)
    return subprocess.Popen(
        list(argv), cwd=cwd, env=dict(env), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def run(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end, its output captured (:func:`subprocess.run`'s answer)."""
    if _in_use is None or not _in_use.can_start(argv, env, cwd):
        return subprocess.run(
            list(argv), cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout
        )
    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        child = _in_use.start(argv, env=env, stdout=out, stderr=err)
        try:
            returncode = child.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise subprocess.TimeoutExpired(list(argv), timeout) from None
        return subprocess.CompletedProcess(
            list(argv), returncode, out.read_text(errors="replace"), err.read_text(errors="replace")
        )


def _read_at_start(env: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith(_READ_AT_START)}


# -- the starter's side ------------------------------------------------------------------


def _serve(socket_path: str) -> dict[str, Any]:
    """Accept requests until the starter's owner ends it; return in each forked child with
    that child's request."""
    for name in PRELOADED:
        importlib.import_module(name)
    owner = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path + ".new")
    listener.listen(64)
    os.rename(socket_path + ".new", socket_path)
    waiting: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while os.getppid() == owner:
        for _ in selector.select(_POLL_SECONDS):
            connection, _address = listener.accept()
            request = _receive(connection)
            if request is None:
                connection.close()
                continue
            ready, told = os.pipe()
            pid = os.fork()
            if pid == 0:
                selector.close()
                listener.close()
                for other in waiting.values():
                    other.close()
                connection.close()
                os.close(ready)
                _become_session(request)
                os.close(told)  # the parent may now signal its process group
                return request
            os.close(told)
            os.read(ready, 1)
            os.close(ready)
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = connection
        _report_ended(waiting)
    return {}


def _receive(connection: socket.socket) -> dict[str, Any] | None:
    """The request on ``connection``; None if its client left before asking."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(65536)
        if not chunk:
            return None
        data += chunk
    request: dict[str, Any] = json.loads(data)
    return request


def _report_ended(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = waiting.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.sendall(json.dumps({"returncode": _returncode(status)}).encode() + b"\n")
            connection.close()


def _returncode(status: int) -> int:
    """Popen's returncode: the exit status, or minus the signal that ended the process."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _become_session(request: dict[str, Any]) -> None:
    """In a forked child: a session of its own, the request's output, no input."""
    os.setsid()
    for stream, path in ((1, request["stdout"]), (2, request["stderr"])):
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(descriptor, stream)
        os.close(descriptor)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.close(nothing)


def _become(request: dict[str, Any]) -> int:
    """In a forked child: run ``request``'s command as a fresh interpreter runs it; its
    exit status."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request["env"])
    argv: list[str] = request["argv"][1:]
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            runpy.run_path(argv[0], run_name="__main__")
    except KeyboardInterrupt:
        # As the interpreter does: end by the signal, so the parent sees -SIGINT.
        traceback.print_exc()
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except SystemExit as exit:
        return _exit_status(exit)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _exit_status(exit: SystemExit) -> int:
    """The status the interpreter gives ``sys.exit(code)``: a message is printed, status 1."""
    if exit.code is None or isinstance(exit.code, int):
        return exit.code or 0
    print(exit.code, file=sys.stderr)
    return 1


def _finish() -> None:
    """What the interpreter's exit does that a process can notice: its threads joined, its
    exit functions run, its output flushed. Tearing down the preloaded modules' objects,
    seconds of CPU with torch's, is left to the operating system."""
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own join
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    child = _serve(sys.argv[1])
    if child:
        status = _become(child)
        _finish()
        os._exit(status)
