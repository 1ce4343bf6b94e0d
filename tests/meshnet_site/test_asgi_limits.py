"""The tracker's bounded bodies (``meshnet_site.asgi_limits``): an over-size body is refused
(413), a chunked one without Content-Length (411), on its headers, before daphne spools it.

The attacks run against a real ``runtracker``; the ASGI layer is also checked alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import httpx
import pytest

from meshnet_site.asgi_limits import BoundedBodies
from tests.support.network import Tracker
from tests.support.nodes import TINY
from tests.support.uploads import assert_error, footprint, stream_upload

MIB = 2**20


# --- the tracker, a real runtracker (daphne) ---------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/nodes/register"])
def test_a_chunked_300_mb_upload_is_refused_early_and_never_written(
    tracker_process: Tracker, path: str
) -> None:
    before = footprint(tracker_process.process.pid)

    upload = stream_upload(
        f"{tracker_process.url}{path}",
        total=300 * MIB,
        headers={"Content-Type": "application/json"},
    )

    after = footprint(tracker_process.process.pid)
    assert_error(upload.status, upload.json_error(), 411, "length_required")
    assert upload.sent <= 8 * MIB, f"{upload.sent} bytes went out before the refusal"
    assert upload.seconds < 10
    assert after.written - before.written < MIB  # no spool file, no buffer written out
    assert after.rss - before.rss < 32 * MIB
    assert httpx.get(f"{tracker_process.url}/healthz", timeout=10).status_code == 200


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(
    tracker_process: Tracker,
) -> None:
    before = footprint(tracker_process.process.pid)

    upload = stream_upload(
        f"{tracker_process.url}/v1/chat/completions",
        total=300 * MIB,
        headers={"Content-Type": "application/json", "Content-Length": str(300 * MIB)},
    )

    after = footprint(tracker_process.process.pid)
    assert_error(upload.status, upload.json_error(), 413, "request_too_large")
    assert upload.sent <= 8 * MIB and upload.seconds < 10
    assert after.written - before.written < MIB


def test_a_body_within_the_limit_still_reaches_the_chat_endpoint(
    tracker_process: Tracker,
) -> None:
    response = httpx.post(
        f"{tracker_process.url}/v1/chat/completions",
        json={"model": TINY, "messages": [{"role": "user", "content": "x" * 500_000}]},
        timeout=30,
    )
    # It got past the size check to the key check.
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


# --- the ASGI layer alone (any server) ---------------------------------------------------


async def _app_reached(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ([(b"content-length", b"2048")], 413, "request_too_large"),
        ([(b"transfer-encoding", b"chunked")], 411, "length_required"),
        ([(b"content-length", b"1024")], 204, None),
        ([], 204, None),
    ],
)
def test_the_asgi_limit_refuses_on_headers_without_reading_the_body(
    headers: list[tuple[bytes, bytes]], status: int, code: str | None
) -> None:
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("the body was read")

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    app = BoundedBodies(_app_reached, limit=1024)
    asyncio.run(app({"type": "http", "method": "POST", "headers": headers}, receive, send))

    assert sent[0]["status"] == status
    if code is not None:
        assert code.encode() in sent[1]["body"]
