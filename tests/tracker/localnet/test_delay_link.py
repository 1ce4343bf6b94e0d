"""The delay link (tracker_app.localnet.delay_link): a TCP relay that adds latency each way."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from tracker_app.localnet import LOOPBACK, free_port
from tracker_app.localnet.delay_link import DelayLink

ONE_WAY_MS = 30


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A loopback TCP server sending back what it reads until the client's end of stream."""
    server = socketserver.ThreadingTCPServer((LOOPBACK, 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield LOOPBACK, int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size and (chunk := sock.recv(size - len(data))):
        data += chunk
    return data


def test_bytes_come_back_unchanged_and_no_sooner_than_one_round_trip_of_the_link(
    echo: tuple[str, int],
) -> None:
    message = bytes(range(256)) * 1024  # larger than one read: several chunks in flight
    with (
        DelayLink(echo, one_way_ms=ONE_WAY_MS) as link,
        socket.create_connection((link.host, link.port), timeout=10) as sock,
    ):
        began = time.monotonic()
        sock.sendall(b"ping")
        first = receive(sock, 4)
        round_trip = time.monotonic() - began
        sock.sendall(message)
        echoed = receive(sock, len(message))
        sock.shutdown(socket.SHUT_WR)
        end = sock.recv(1)

    assert first == b"ping"
    assert round_trip >= 2 * ONE_WAY_MS / 1000
    assert echoed == message
    assert end == b""  # the end of stream went through too, both ways
    assert link.connections == 1
    assert link.url == f"http://{LOOPBACK}:{link.port}"


def test_a_connection_through_a_link_whose_target_is_down_is_closed() -> None:
    with (
        DelayLink((LOOPBACK, free_port()), one_way_ms=ONE_WAY_MS) as link,
        socket.create_connection((link.host, link.port), timeout=10) as sock,
    ):
        try:
            ended = sock.recv(1)
        except ConnectionResetError:
            ended = b""

    assert ended == b""
    assert link.connections == 0


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        DelayLink((LOOPBACK, 1), one_way_ms=-1)
