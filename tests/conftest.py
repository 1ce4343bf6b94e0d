"""Fixtures shared by every test package: real services, found or started."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout} s")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis: REDIS_URL when set (CI), else a private redis-server for this run.

    Tests that use it must namespace their keys (or use a database of their
    own) because CI's Redis is shared with the tracker under test.
    """
    configured = os.environ.get("REDIS_URL")
    if configured:
        yield configured
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("these tests need Redis: set REDIS_URL or install redis-server")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextlib.contextmanager
def fresh_process_database() -> Iterator[str]:
    """A new, migrated database for real tracker/worker processes.

    PostgreSQL when DATABASE_URL points at one (CI): a new database on that
    server, dropped afterwards. Otherwise a SQLite file of its own.
    """
    configured = os.environ.get("DATABASE_URL", "")
    if not configured.startswith(("postgres://", "postgresql://")):
        directory = tempfile.mkdtemp(prefix="meshnet-proc-")
        url = f"sqlite:///{directory}/tracker.sqlite3"
        _migrate(url)
        yield url
        return
    import psycopg

    name = f"meshnet_proc_{uuid.uuid4().hex[:10]}"
    server = configured.rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"{server}/{name}"
        _migrate(url)
        yield url
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def process_database_url() -> Iterator[str]:
    """One process database shared by the tests that only need a tracker to exist."""
    with fresh_process_database() as url:
        yield url


def query_process_database(database_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read what tracker processes wrote (``%s`` placeholders, either database)."""
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            return list(conn.execute(sql.replace("%s", "?"), params))
    import psycopg

    with psycopg.connect(database_url) as conn:
        return list(conn.execute(sql, params))


def process_env(database_url: str, **overrides: str) -> dict[str, str]:
    """The environment for a tracker, worker or node process under test."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SECRET_KEY": "test-secret-key-for-processes",
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
    }
    env.update(overrides)
    return env


def _migrate(database_url: str) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=process_env(database_url),
        check=True,
    )


class ManagedProcess:
    """A real process of the project, its output kept in a log file for failures."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


def start_manage_command(args: list[str], env: dict[str, str], log_path: Path) -> ManagedProcess:
    return ManagedProcess([sys.executable, str(ROOT / "manage.py"), *args], env, log_path)


@dataclass
class TrackerProcess:
    url: str
    database_url: str
    managed: ManagedProcess


@pytest.fixture
def tracker_process(process_database_url: str, tmp_path: Path) -> Iterator[TrackerProcess]:
    """A real `runtracker` (daphne) on a free port over the process database."""
    port = free_port()
    managed = start_manage_command(
        ["runtracker", "--host", "127.0.0.1", "--port", str(port)],
        process_env(process_database_url),
        tmp_path / "tracker.log",
    )
    try:
        wait_for_port("127.0.0.1", port)
    except TimeoutError:
        managed.stop()
        raise AssertionError("tracker did not start:\n" + managed.output()) from None
    yield TrackerProcess(f"http://127.0.0.1:{port}", process_database_url, managed)
    managed.stop()


def start_worker(env: dict[str, str], log_path: Path) -> ManagedProcess:
    """A real Celery worker with the beat scheduler embedded (`worker -B`)."""
    from tracker_app.launcher import worker_argv

    argv = worker_argv("--pool", "solo", "--schedule", str(log_path.parent / "celerybeat-schedule"))
    return ManagedProcess(argv, env, log_path)
