"""Oversized and unbounded uploads as an attacker sends them, what they cost the server, and
the refusal they get."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


@dataclass
class Upload:
    """What came back for a streamed upload, and how much of it was sent before."""

    status: int | None
    body: bytes
    sent: int
    seconds: float
    error: str = ""

    def json_error(self) -> dict[str, str]:
        import json

        return dict(json.loads(self.body)["error"])


def stream_upload(
    url: str,
    *,
    total: int,
    chunk: int = 2**20,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Upload:
    """POST ``total`` bytes from a generator (chunked, no Content-Length unless
    ``headers`` declares one), stopping at the server's answer or its close."""
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        block = b"x" * chunk
        while sent < total:
            piece = block[: min(chunk, total - sent)]
            sent += len(piece)
            yield piece

    began = time.monotonic()
    try:
        response = httpx.post(url, content=body(), headers=headers, timeout=timeout)
    except httpx.HTTPError as error:
        return Upload(None, b"", sent, time.monotonic() - began, f"{type(error).__name__}")
    return Upload(response.status_code, response.content, sent, time.monotonic() - began)


@dataclass(frozen=True)
class Footprint:
    """A process's resident memory and every byte it has written (files, sockets, pipes)."""

    rss: int
    written: int


def footprint(pid: int) -> Footprint:
    """Read from /proc (Linux): VmRSS and ``wchar``."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    io = Path(f"/proc/{pid}/io").read_text()
    written = next(int(line.split()[1]) for line in io.splitlines() if line.startswith("wchar"))
    return Footprint(rss=rss_kib * 1024, written=written)


def assert_error(status: int | None, body: dict[str, Any], expected: int, code: str) -> None:
    """A refusal with ``expected`` status and ``code``, in the API's error shape."""
    assert status == expected
    assert body["code"] == code
    assert set(body) == {"message", "type", "code"}
