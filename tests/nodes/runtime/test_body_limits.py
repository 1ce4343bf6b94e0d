"""What a node reads is bounded before it is read: a hop-link frame only up to the node's
frame limit, a step's bytes exactly what its shape needs, a head's generate body and its
prompt's characters capped before tokenising. The attacks run against real node processes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from nodes_app.protocol.limits import GENERATE_MAX_BYTES, GENERATE_MAX_PROMPT_CHARS
from nodes_app.runtime.head.hop_links import link_url
from tests.support.link import node_link, tiny_step
from tests.support.nodes import TINY, running_nodes, start_node
from tests.support.uploads import assert_error, footprint
from tracker_app.localnet import NodeProcess, wait_until

MIB = 2**20


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
