"""Peers of a node's hop link as tests play them: guarded nodes, signed steps, raw sockets.

A *guarded* node is a tiny-model node that obeys only plans signed by a key
the test holds (``--tracker-key``, no tracker), so a test can be both an
honest head (a plan signed by that key) and a stranger (none, or a forged
one). Raw links may come from any loopback address (127.0.0.2, ...), so one
test can be several peers.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from websockets.sync.client import ClientConnection, connect

from nodes_app.runtime.engine.trust import new_capability
from nodes_app.runtime.head.hop_links import link_url
from nodes_app.runtime.wire.entries import ForwardStep, LinkStep
from tests.support.link import HIDDEN, LinkClient
from tests.support.nodes import TINY
from tests.support.plans import signed_plan
from tracker_app.localnet import NodeProcess, process_env
from tracker_app.localnet import start_node as start_localnet_node

MIDDLE = (1, 2)  # a guarded node's layers: a middle hop, whose answers are hidden states


def public_hex(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def start_guarded_node(
    tmp: Path, key: Ed25519PrivateKey, *, node_id: str, extra: list[str]
) -> NodeProcess:
    """A middle-hop node trusting plans signed by ``key`` only; not waited for."""
    return start_localnet_node(
        name=node_id,
        model=TINY,
        layers=MIDDLE,
        env=process_env(),
        log_dir=tmp,
        node_id=node_id,
        extra=["--tracker-key", public_hex(key), *extra],
    )


def opening_step(
    key: Ed25519PrivateKey, node: NodeProcess, step_id: int, *, rows: int = 2
) -> tuple[LinkStep, str]:
    """A session's opening step for ``node`` with a plan signed by ``key``, and its capability."""
    request_id = f"link-{uuid.uuid4().hex[:12]}"
    plan = signed_plan(
        key,
        request_id=request_id,
        model=TINY,
        hops=[
            {"node_id": "head", "endpoint": "http://127.0.0.1:9", "start_layer": 0, "end_layer": 0},
            node.hop(),
            {"node_id": "tail", "endpoint": "http://127.0.0.1:9", "start_layer": 3, "end_layer": 3},
        ],
    )
    capability = new_capability()
    step = middle_step(f"{request_id}.s", rows)
    return LinkStep(step_id, step, hidden(rows), capability, plan.to_header()), capability


def middle_step(session: str, rows: int, *, position: int = 0) -> ForwardStep:
    return ForwardStep(
        session_id=session,
        start=MIDDLE[0],
        end=MIDDLE[1],
        position=position,
        dtype="float32",
        shape=(1, rows, HIDDEN),
        sampling=None,
    )


def hidden(rows: int) -> bytes:
    return bytes(4 * HIDDEN * rows)


def connected_socket(endpoint: str, *, source: str = "127.0.0.1", rcvbuf: int = 0) -> socket.socket:
    """A TCP connection to ``endpoint`` from ``source`` (receive buffer ``rcvbuf`` if set)."""
    host, port = endpoint.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    sock.connect((host, int(port)))
    return sock


@contextlib.contextmanager
def raw_link(
    endpoint: str, *, source: str = "127.0.0.1", rcvbuf: int = 0
) -> Iterator[ClientConnection]:
    """A websocket to ``endpoint``'s link from ``source``, nothing sent yet."""
    sock = connected_socket(endpoint, source=source, rcvbuf=rcvbuf)
    with connect(
        link_url(endpoint), sock=sock, max_size=None, compression=None, close_timeout=1
    ) as websocket:
        assert isinstance(websocket, ClientConnection)
        yield websocket


def link_client(websocket: ClientConnection, *, timeout: float = 30.0) -> LinkClient:
    def receive() -> bytes:
        message = websocket.recv(timeout=timeout)
        assert isinstance(message, bytes)
        return message

    return LinkClient(websocket.send, receive)
