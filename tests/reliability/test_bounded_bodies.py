"""Issue 12: every body is bounded before it is read; reported numbers are bounded too.

The tracker refuses an over-size body (413) or a chunked one without
Content-Length (411) on its headers, before daphne spools it; a node reads a
hop-link frame only up to its frame limit, and a step's bytes must be exactly
what its shape needs; a head caps the generate body and
the prompt's characters before tokenising; registrations and heartbeats carry
numbers in sane ranges or get a 400. The attacks run against real processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from rest_framework.test import APIClient
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from meshnet_site.asgi_limits import BoundedBodies
from nodes_app.protocol.limits import GENERATE_MAX_BYTES, GENERATE_MAX_PROMPT_CHARS
from nodes_app.runtime.links import link_url
from tests.support.challenge import ChallengeResponder
from tests.support.link import node_link, tiny_step
from tests.support.network import Tracker
from tests.support.nodes import TINY, running_nodes, start_node
from tests.support.registration import proven_registration
from tests.support.uploads import footprint, stream_upload
from tracker_app.localnet import NodeProcess, wait_until

MIB = 2**20
PROMPT = [{"role": "user", "content": "Tell me about meshes."}]


def assert_error(status: int | None, body: dict[str, Any], expected: int, code: str) -> None:
    assert status == expected
    assert body["code"] == code
    assert set(body) == {"message", "type", "code"}


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


# --- the nodes, real processes without a tracker -----------------------------------------


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, NodeProcess]]:
    tmp = tmp_path_factory.mktemp("bounded-nodes")
    layouts = {"head": (0, 1), "tail": (2, 3)}
    with running_nodes(tmp, TINY, layouts, prefix="bounded", timeout=120) as started:
        yield started


def loopback_buffers() -> int:
    """The most a TCP connection's send and receive buffers may hold here (bytes): the
    kernel grows them with the traffic, up to these limits (32 MiB + 4 MiB on this
    project's machines)."""
    most = 0
    for name in ("tcp_wmem", "tcp_rmem"):
        most += int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
    return most


def test_a_link_frame_over_the_nodes_limit_closes_the_link_before_it_is_read_whole(
    tmp_path: Path,
) -> None:
    tail = start_node(
        tmp_path, TINY, (2, 3), node_id="bounded-frames", extra_args=["--max-frame-bytes", str(MIB)]
    )
    try:
        tail.wait_serving(timeout=120)
        before = footprint(tail.process.pid)
        sent = 0
        # Far more than the node's limit and the kernel's buffers could take together.
        total = max(300 * MIB, 8 * loopback_buffers())

        def fragments() -> Iterator[bytes]:
            nonlocal sent
            while sent < total:
                sent += MIB // 4
                yield bytes(MIB // 4)

        with (
            connect(link_url(tail.endpoint), compression=None) as websocket,
            pytest.raises(ConnectionClosed) as closed,
        ):
            websocket.send(fragments())
            websocket.recv(timeout=30)

        after = footprint(tail.process.pid)
        # The node closes with 1009 (message too big); its close frame may be lost
        # to the connection reset while the sender is still writing.
        assert closed.value.rcvd is None or closed.value.rcvd.code == 1009
        # What went out before the refusal: the frame's limit, plus what the kernel
        # buffers on both ends of a loopback connection took before the node read it.
        assert sent <= MIB + loopback_buffers() + MIB, f"{sent} bytes went out first"
        assert after.rss - before.rss < 32 * MIB
        with node_link(tail.endpoint) as link:
            assert link.step(tiny_step("after", 2), bytes(2 * 64 * 4)).status == 200
    finally:
        tail.stop()


def test_a_step_longer_than_its_shape_is_refused_before_any_tensor_work(
    nodes: dict[str, NodeProcess],
) -> None:
    tail = nodes["tail"]

    with node_link(tail.endpoint) as link:
        long = link.step(tiny_step("long", 2), bytes(8 * MIB))
        good = link.step(tiny_step("good", 2), bytes(2 * 64 * 4))
        link.cancel("good")

    assert (long.status, long.code) == (400, "bad_length")
    assert good.status == 200
    wait_until(lambda: tail.health()["cached_sessions"] == 0)


def generate_body(head: NodeProcess, tail: NodeProcess, content: str) -> dict[str, Any]:
    return {
        "request_id": f"big-{time.monotonic_ns()}",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "temperature": 0.0,
        "plan": {"model": TINY, "hops": [head.hop(), tail.hop()]},
    }


def test_a_20_mb_prompt_to_a_head_is_refused_quickly_without_tokenising(
    nodes: dict[str, NodeProcess],
) -> None:
    head, tail = nodes["head"], nodes["tail"]
    before = footprint(head.process.pid)
    began = time.monotonic()

    response = httpx.post(
        f"{head.endpoint}/v1/generate",
        json=generate_body(head, tail, "x" * 20_000_000),
        timeout=60,
    )

    elapsed = time.monotonic() - began
    assert_error(response.status_code, response.json()["error"], 413, "request_too_large")
    assert str(GENERATE_MAX_BYTES) in response.json()["error"]["message"]
    assert elapsed < 5
    assert footprint(head.process.pid).rss - before.rss < 64 * MIB


def test_a_prompt_past_the_character_cap_is_refused_before_tokenising(
    nodes: dict[str, NodeProcess],
) -> None:
    head, tail = nodes["head"], nodes["tail"]
    began = time.monotonic()

    response = httpx.post(
        f"{head.endpoint}/v1/generate",
        json=generate_body(head, tail, "x" * (GENERATE_MAX_PROMPT_CHARS + 1)),
        timeout=60,
    )

    assert_error(response.status_code, response.json()["error"], 400, "prompt_too_long")
    assert time.monotonic() - began < 5
    answer = httpx.post(
        f"{head.endpoint}/v1/generate", json=generate_body(head, tail, "hello"), timeout=60
    )
    assert answer.status_code == 200


# --- numbers a node reports --------------------------------------------------------------


@pytest.fixture
def client() -> APIClient:
    return APIClient()


def registered(client: APIClient, responder: ChallengeResponder) -> tuple[str, str]:
    response = client.post("/api/nodes/register", proven_registration(responder), format="json")
    assert response.status_code == 201, response.content
    return response.json()["node_id"], response.json()["node_token"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("active_sessions", 10**20),
        ("active_sessions", 1e20),
        ("queue_depth", 10**20),
        ("queue_depth", -1),
        ("measured_tps", 1e308),
        ("measured_tps", 10**400),
    ],
)
def test_a_heartbeat_with_an_absurd_number_is_a_400_naming_it(
    client: APIClient, responder: ChallengeResponder, field: str, value: Any
) -> None:
    node_id, token = registered(client, responder)
    body = {"active_sessions": 1, "queue_depth": 0, "measured_tps": 10.0, field: value}

    response = client.post(
        f"/api/nodes/{node_id}/heartbeat",
        body,
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )

    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["message"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [("benchmark_tps", 1e12), ("shard_end", 10**20), ("num_layers", 10**20)],
)
def test_a_registration_with_an_absurd_number_is_a_400_naming_it(
    client: APIClient, responder: ChallengeResponder, field: str, value: Any
) -> None:
    response = client.post(
        "/api/nodes/register", proven_registration(responder, **{field: value}), format="json"
    )

    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["message"]
    if field == "benchmark_tps":
        # One rule for a speed claim: the service's MESHNET_NODE_MAX_BENCHMARK_TPS cap.
        assert response.json()["error"]["code"] == "benchmark_out_of_range"
