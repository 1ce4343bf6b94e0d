"""A throwaway local network for benchmarks: tracker + `runnode` processes on free ports.

Everything runs as real processes over a temporary SQLite database, exactly
as an operator would start them; ``LocalNet`` stops them all on exit.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalNet:
    def __init__(self, **settings: str) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="meshnet-bench-"))
        self.env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{self.tmp}/tracker.sqlite3",
            "DJANGO_SECRET_KEY": "bench-only-secret",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "MESHNET_RATE_LIMIT_PER_MINUTE": "100000",
            **settings,
        }
        for name in ("REDIS_URL",):  # a benchmark is one machine: embedded mode
            self.env.pop(name, None)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.url = ""
        self.api_key = ""

    def __enter__(self) -> LocalNet:
        self._manage("migrate", "--noinput", "-v", "0", wait=True)
        port = free_port()
        self._manage("runtracker", "--host", "127.0.0.1", "--port", str(port), log="tracker")
        self.url = f"http://127.0.0.1:{port}"
        self._wait(lambda: httpx.get(f"{self.url}/healthz").status_code == 200, "tracker")
        out = subprocess.run(
            [sys.executable, "manage.py", "create_api_key", "bench"],
            cwd=ROOT, env=self.env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        self.api_key = out.stdout.strip().splitlines()[-1]
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()

    def node(self, model: str, layers: str, *extra: str) -> None:
        port = free_port()
        self._manage(
            "runnode", "--model", model, "--layers", layers, "--port", str(port),
            "--tracker", self.url, "--threads", "1", "--wallet-key",
            str(self.tmp / f"wallet-{port}.key"), *extra, log=f"node-{port}",
        )  # fmt: skip

    def wait_for_model(self, model: str, timeout: float = 300) -> list[dict[str, Any]]:
        """Wait until ``model`` has a route; return the hops of its best candidate."""

        def served() -> bool:
            listed = httpx.get(f"{self.url}/v1/models").json()["data"]
            return any(entry["id"] == model for entry in listed)

        self._wait(served, f"a route for {model}", timeout)
        table = httpx.get(f"{self.url}/v1/routing", params={"model": model}).json()
        return list(table["models"][0]["routes"][0]["hops"])

    def _manage(self, *args: str, log: str = "", wait: bool = False) -> None:
        argv = [sys.executable, "manage.py", *args]
        if wait:
            subprocess.run(argv, cwd=ROOT, env=self.env, check=True)
            return
        with (self.tmp / f"{log}.log").open("wb") as out:
            self.processes.append(
                subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)
            )

    def _wait(self, condition: Any, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{what} not ready after {timeout} s (logs in {self.tmp})")
