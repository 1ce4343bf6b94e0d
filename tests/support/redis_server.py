"""A redis-server of a test's own, on a port of its own, that the test may stop and start.

CI's Redis is shared by every test and the tracker under test: a test that
takes Redis away must take away its own (never the shared one).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import TracebackType

from tracker_app.localnet import LOOPBACK, ManagedProcess, free_port, wait_for_port


class RedisServer:
    """``redis-server`` on a free loopback port, without persistence; a context manager.

    :meth:`stop` and :meth:`start` take it away and bring it back on the same
    port (empty, as a restarted Redis without persistence is).
    """

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://{LOOPBACK}:{self.port}/0"
        self._argv = [
            binary, "--port", str(self.port), "--bind", LOOPBACK, "--save", "",
            "--appendonly", "no", "--dir", str(workdir),
        ]  # fmt: skip
        self._process: ManagedProcess | None = None
        self._starts = 0

    def start(self) -> None:
        """Start it (again) and wait until it accepts connections."""
        self._starts += 1
        self._process = ManagedProcess(
            "redis", self._argv, env=os.environ, log_path=self.workdir / f"redis-{self._starts}.log"
        )
        wait_for_port(LOOPBACK, self.port, process=self._process)

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL); its port refuses connections after."""
        if self._process is not None:
            self._process.stop()
            self._process = None

    def __enter__(self) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
