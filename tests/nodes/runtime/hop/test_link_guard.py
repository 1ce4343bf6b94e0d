"""A node keeps a hop link only for a head that shows a plan, and only while it is used.

One real node process (tiny model, layers 1-2, obeying plans signed by the test's key,
with short link limits) and links opened to it from several loopback addresses: the
stranger that sends nothing or only forged plans, the peer holding too many links, the
head that goes idle, the head that never reads its answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection

from nodes_app.protocol.limits import (
    LINK_CLOSE_IDLE,
    LINK_FIRST_FRAME_BYTES,
    LINK_MAX_HEADER_BYTES,
)
from nodes_app.runtime.head.hop_links import HopLinks
from nodes_app.runtime.wire.entries import StepAnswer
from nodes_app.runtime.wire.frames import decode_answers, encode_requests
from tests.support.link_peers import (
    hidden,
    link_client,
    opening_step,
    raw_link,
    start_guarded_node,
)
from tracker_app.localnet import NodeProcess, wait_until

HELLO, IDLE, PER_PEER, WRITE = 1.0, 3.0, 3, 2.0
SEND_BUFFER = 256 * 1024


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, key: Ed25519PrivateKey) -> Iterator[NodeProcess]:
    tmp = tmp_path_factory.mktemp("link-guard")
    limits = [
        *("--link-hello-timeout", str(HELLO), "--link-idle-timeout", str(IDLE)),
        *("--max-links-per-peer", str(PER_PEER), "--link-write-timeout", str(WRITE)),
        *("--link-send-buffer", str(SEND_BUFFER)),
    ]
    node = start_guarded_node(tmp, key, node_id="guarded", extra=limits)
    with node.process:
        node.wait_serving(timeout=120)
        yield node


def closed_with(websocket: object, timeout: float) -> int | None:
    """The close code the node ended ``websocket`` with, waiting at most ``timeout`` s."""
    recv = websocket.recv  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    with pytest.raises(ConnectionClosed) as closed:
        while time.monotonic() < deadline:
            recv(timeout=deadline - time.monotonic())
    return closed.value.rcvd.code if closed.value.rcvd else None


def received(websocket: ClientConnection) -> bytes:
    message = websocket.recv(timeout=10)
    assert isinstance(message, bytes)
    return message


def test_a_link_that_sends_no_plan_is_closed_after_the_hello_timeout(node: NodeProcess) -> None:
    with raw_link(node.endpoint, source="127.0.0.11") as websocket:
        started = time.monotonic()
        assert closed_with(websocket, timeout=HELLO + 5) == 1008
        assert HELLO - 0.2 <= time.monotonic() - started <= HELLO + 3
    assert "no valid plan or capability within" in node.process.output()


def test_a_link_that_shows_only_forged_plans_is_closed_and_its_address_barred(
    node: NodeProcess, key: Ed25519PrivateKey
) -> None:
    forger = Ed25519PrivateKey.generate()
    with raw_link(node.endpoint, source="127.0.0.12") as websocket:
        link = link_client(websocket)
        forged = [opening_step(forger, node, link.next_id())[0] for _ in range(8)]
        honest, _ = opening_step(key, node, link.next_id())
        # Four refusals are a stranger's allowance; the fifth closes the link before the
        # rest of its frame (the honest step behind them included) is looked at.
        link.send_frame(encode_requests([*forged, honest]))
        answers: list[StepAnswer] = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                answers += decode_answers(received(websocket))
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        assert [answer.step_id for answer in answers] == [step.step_id for step in forged[:5]]
        assert {(answer.status, answer.code) for answer in answers} == {
            (403, "plan_signature_invalid")
        }
    assert node.health()["active_sessions"] == 0
    # Its address may try again, PER_PEER times within a hello timeout, then gets no
    # new link for the next hello timeout.
    for _ in range(PER_PEER - 1):
        with raw_link(node.endpoint, source="127.0.0.12") as websocket:
            forged = [opening_step(forger, node, i)[0] for i in range(5)]
            websocket.send(encode_requests(forged))
            assert closed_with(websocket, timeout=5) == 1008
    with pytest.raises(InvalidStatus), raw_link(node.endpoint, source="127.0.0.12"):
        pass
    time.sleep(HELLO + 0.2)
    with raw_link(node.endpoint, source="127.0.0.12") as websocket:
        link = link_client(websocket)
        step, capability = opening_step(key, node, link.next_id())
        assert link.exchange([step])[0].status == 200
        assert link.cancel(step.step.session_id, capability=capability).status == 204


def test_a_first_frame_past_the_first_frame_limit_is_refused_as_it_arrives(
    node: NodeProcess, key: Ed25519PrivateKey
) -> None:
    with raw_link(node.endpoint, source="127.0.0.13") as websocket:
        link = link_client(websocket)
        # A valid opening step, but too big to be a stranger's first frame: never read.
        step, _ = opening_step(key, node, link.next_id(), rows=2000)
        link.send_frame(encode_requests([step]))
        assert closed_with(websocket, timeout=10) == 1009
    assert f"a frame over {LINK_FIRST_FRAME_BYTES} bytes" in node.process.output()
    assert node.health()["active_sessions"] == 0


def test_headers_past_their_bound_or_nested_too_deep_close_the_link_unparsed(
    node: NodeProcess, key: Ed25519PrivateKey
) -> None:
    deep = b'{"steps":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with raw_link(node.endpoint, source="127.0.0.19") as websocket:
        websocket.send(struct.pack("<I", len(deep)) + deep)
        assert closed_with(websocket, timeout=10) == 1007
    # A link that showed a plan may send bigger headers, up to 1 MiB + an eighth of its frame.
    header = b'{"steps":[' + b"0," * (LINK_MAX_HEADER_BYTES // 2 + 100_000) + b"0]}"
    with raw_link(node.endpoint, source="127.0.0.20") as websocket:
        link = link_client(websocket)
        step, capability = opening_step(key, node, link.next_id())
        assert link.exchange([step])[0].status == 200
        websocket.send(struct.pack("<I", len(header)) + header)
        assert closed_with(websocket, timeout=10) == 1007
    with raw_link(node.endpoint, source="127.0.0.20") as websocket:
        assert (
            link_client(websocket).cancel(step.step.session_id, capability=capability).status == 204
        )
    output = node.process.output()
    assert "a frame header that is not JSON" in output
    frame_bytes = 4 + len(header)
    assert f"bytes, over the {LINK_MAX_HEADER_BYTES + frame_bytes // 8} read" in output
    assert "Traceback" not in output


def test_a_head_opens_its_link_with_a_hello_then_sends_frames_of_any_size(
    node: NodeProcess, key: Ed25519PrivateKey
) -> None:
    async def head() -> tuple[int, int]:
        links = HopLinks()
        opening, capability = opening_step(key, node, 0, rows=2000)
        answer = await links.to(node.endpoint).step(
            opening.step, opening.body, capability=capability, plan=opening.plan, timeout=30
        )
        cancelled = await links.to(node.endpoint).cancel(
            opening.step.session_id, capability=capability, timeout=30
        )
        await links.aclose()
        return answer.status, cancelled.status

    assert asyncio.run(head()) == (200, 204)


def test_links_from_one_address_past_the_limit_are_refused_and_others_are_not(
    node: NodeProcess, key: Ed25519PrivateKey
) -> None:
    with (
        raw_link(node.endpoint, source="127.0.0.14"),
        raw_link(node.endpoint, source="127.0.0.14"),
        raw_link(node.endpoint, source="127.0.0.14"),
    ):
        with pytest.raises(InvalidStatus) as refused, raw_link(node.endpoint, source="127.0.0.14"):
            pass
        assert refused.value.response.status_code == 403
        with raw_link(node.endpoint, source="127.0.0.15") as websocket:
            link = link_client(websocket)
            step, capability = opening_step(key, node, link.next_id())
            [answer] = link.exchange([step])
            assert answer.status == 200
            assert link.cancel(step.step.session_id, capability=capability).status == 204


def test_a_link_that_keeps_sending_forged_plans_after_a_valid_one_is_closed(
    node: NodeProcess, key: Ed25519PrivateKey
) -> None:
    forger = Ed25519PrivateKey.generate()
    with raw_link(node.endpoint, source="127.0.0.16") as websocket:
        link = link_client(websocket)
        step, capability = opening_step(key, node, link.next_id())
        assert link.exchange([step])[0].status == 200
        forged = [opening_step(forger, node, link.next_id())[0] for _ in range(200)]
        link.send_frame(encode_requests(forged))
        refused: list[StepAnswer] = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                refused += decode_answers(received(websocket))
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        # 16 refusals are allowed a link with one admitted step; the 17th closes it.
        assert len(refused) == 17
        assert {answer.code for answer in refused} == {"plan_signature_invalid"}
    assert "17 entries refused against 1 admitted" in node.process.output()
    wait_until(lambda: node.health()["active_sessions"] == 1)
    with raw_link(node.endpoint, source="127.0.0.16") as websocket:
        assert (
            link_client(websocket).cancel(step.step.session_id, capability=capability).status == 204
        )


def test_an_idle_link_is_closed_and_the_head_opens_a_new_one_for_its_next_step(
    node: NodeProcess, key: Ed25519PrivateKey
) -> None:
    with raw_link(node.endpoint, source="127.0.0.17") as websocket:
        link = link_client(websocket)
        step, capability = opening_step(key, node, link.next_id())
        assert link.exchange([step])[0].status == 200
        started = time.monotonic()
        # Pings answered do not keep it open: only valid steps do.
        websocket.ping()
        assert closed_with(websocket, timeout=IDLE + 5) == LINK_CLOSE_IDLE
        assert IDLE - 0.2 <= time.monotonic() - started <= IDLE + 3
        link_client_cancel = step.step.session_id

    async def head() -> list[int]:
        # The product's head end: its link is closed as idle between two steps.
        links = HopLinks()
        statuses = []
        opening, head_capability = opening_step(key, node, 0)
        for position in (0, 2):
            if position:
                await asyncio.sleep(IDLE + 1.5)
            answer = await links.to(node.endpoint).step(
                dataclasses.replace(opening.step, position=position),
                hidden(2),
                capability=head_capability,
                plan=opening.plan if position == 0 else None,
                timeout=30,
            )
            statuses.append(answer.status)
        await links.to(node.endpoint).cancel(
            opening.step.session_id, capability=head_capability, timeout=30
        )
        await links.aclose()
        return statuses

    assert asyncio.run(head()) == [200, 200]
    with raw_link(node.endpoint, source="127.0.0.17") as websocket:
        assert (
            link_client(websocket).cancel(link_client_cancel, capability=capability).status == 204
        )


def test_a_peer_that_does_not_read_its_answers_is_cut_off(
    node: NodeProcess, key: Ed25519PrivateKey
) -> None:
    rows = 2000  # 500 KiB of hidden states a step, and as much answered
    with raw_link(node.endpoint, source="127.0.0.18", rcvbuf=4096) as websocket:
        link = link_client(websocket)
        small, _ = opening_step(key, node, link.next_id())
        assert link.exchange([small])[0].status == 200  # shown a plan: big frames are read
        steps = [opening_step(key, node, link.next_id(), rows=rows)[0] for _ in range(48)]
        for step in steps:
            link.send_frame(encode_requests([step]))
        # Nothing read: answers pile up on the node until it cuts the peer off.
        wait_until(
            lambda: "does not read its answers" in node.process.output(),
            timeout=WRITE + 60,
            what="the node to cut the non-reading peer off",
        )
        with pytest.raises((ConnectionClosed, OSError)):
            while True:
                websocket.recv(timeout=10)
    # The node keeps serving, and its sessions time out as any others.
    assert node.health()["status"] == "ok"
    with raw_link(node.endpoint, source="127.0.0.18") as websocket:
        link = link_client(websocket)
        step, capability = opening_step(key, node, link.next_id())
        assert link.exchange([step])[0].status == 200
        assert link.cancel(step.step.session_id, capability=capability).status == 204


def test_a_node_refuses_link_options_out_of_range(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    node = start_guarded_node(
        tmp_path, key, node_id="bad-options", extra=["--link-idle-timeout", "0"]
    )
    assert node.process.wait(timeout=120) != 0
    assert "--link-idle-timeout" in node.process.output()
