"""The tracker's connections to heads (httpx's pool on its own asyncio sockets), against
a real socket server: streamed bodies read whole, timeouts and failures as httpx's."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tracker_app.completions.upstream import upstream_transport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def client() -> httpx.AsyncClient:
    limits = httpx.Limits(max_keepalive_connections=4, keepalive_expiry=5.0)
    return httpx.AsyncClient(transport=upstream_transport(limits))


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def request_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def serving(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def three_posts(handler: Handler) -> list[bytes]:
    """The bodies of three requests to a head served by ``handler``, 50 ms apart, on one client
    (the pause lets a close the head sent reach the idle connection)."""
    server, url = await serving(handler)
    bodies = []
    async with server, client() as http:
        for _ in range(3):
            response = await http.post(url, json={})
            bodies.append(response.content)
            await asyncio.sleep(0.05)
    return bodies


def test_a_stream_sent_in_pieces_is_read_whole_and_in_order() -> None:
    pieces = [b"data: %d\n\n" % i for i in range(50)]

    async def head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        writer.write(OK_HEAD)
        for i, piece in enumerate(pieces):
            writer.write(chunk(piece))
            if i % 7 == 0:
                await writer.drain()
                await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def scenario() -> bytes:
        server, url = await serving(head)
        async with server, client() as http, http.stream("POST", url, json={}) as response:
            return b"".join([part async for part in response.aiter_raw()])

    assert asyncio.run(scenario()) == b"".join(pieces)


def test_a_head_silent_past_the_read_timeout_is_a_read_timeout_even_after_longer_waits() -> None:
    async def head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)  # the first request: answered whole, after a wait
        writer.write(OK_HEAD + chunk(b": step\n\n"))
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(chunk(b"data: 1\n\n") + b"0\r\n\r\n")
        await writer.drain()
        await request_head(reader)  # the second, on the same connection: never answered
        writer.write(OK_HEAD)
        await writer.drain()
        await asyncio.sleep(30)

    async def scenario() -> float:
        server, url = await serving(head)
        async with server, client() as http:
            # A read that waited under a long timeout; the next one must not inherit it.
            response = await http.post(url, json={}, timeout=60.0)
            assert response.content == b": step\n\ndata: 1\n\n"
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(httpx.ReadTimeout):
                async with http.stream("POST", url, json={}, timeout=0.3) as streamed:
                    async for _ in streamed.aiter_raw():
                        pass
            return loop.time() - started

    assert asyncio.run(scenario()) < 5.0


def test_a_head_that_keeps_its_connection_alive_answers_every_request_on_one() -> None:
    connections = 0

    async def head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError):
            while True:
                await request_head(reader)
                writer.write(OK_HEAD + chunk(b"data: 1\n\n") + b"0\r\n\r\n")
                await writer.drain()

    assert asyncio.run(three_posts(head)) == [b"data: 1\n\n"] * 3
    assert connections == 1


def test_a_kept_alive_connection_the_head_closed_is_not_used_again() -> None:
    connections = 0

    async def head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await request_head(reader)
        writer.write(OK_HEAD + chunk(b"data: 1\n\n") + b"0\r\n\r\n")
        await writer.drain()
        writer.close()  # after one answer, as a node past its keep-alive does

    assert asyncio.run(three_posts(head)) == [b"data: 1\n\n"] * 3
    assert connections == 3


def test_a_head_that_drops_the_connection_mid_stream_is_a_read_failure() -> None:
    async def head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        writer.write(OK_HEAD + chunk(b"data: 1\n\n"))
        await writer.drain()
        writer.transport.abort()

    async def scenario() -> None:
        server, url = await serving(head)
        async with server, client() as http, http.stream("POST", url, json={}) as response:
            async for _ in response.aiter_raw():
                pass

    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        asyncio.run(scenario())


def test_an_endpoint_nobody_listens_on_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def scenario() -> None:
        async with client() as http:
            await http.post(f"http://127.0.0.1:{port}/v1/generate", json={})

    with pytest.raises(httpx.ConnectError):
        asyncio.run(scenario())


def self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context for ``localhost`` and a client context that trusts only it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_path, key_path)
    return server, ssl.create_default_context(cafile=str(cert_path))


def test_a_head_behind_tls_is_read_over_tls_on_a_kept_alive_connection(tmp_path: Path) -> None:
    server_context, client_context = self_signed(tmp_path)
    connections = 0

    async def head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await request_head(reader)
                writer.write(OK_HEAD + chunk(b"data: 1\n\n") + b"0\r\n\r\n")
                await writer.drain()

    async def scenario() -> list[bytes]:
        server = await asyncio.start_server(head, "127.0.0.1", 0, ssl=server_context)
        port = server.sockets[0].getsockname()[1]
        limits = httpx.Limits(max_keepalive_connections=4, keepalive_expiry=5.0)
        transport = upstream_transport(limits, verify=client_context)
        async with server, httpx.AsyncClient(transport=transport) as http:
            return [
                (await http.post(f"https://localhost:{port}/", json={})).content for _ in range(2)
            ]

    assert asyncio.run(scenario()) == [b"data: 1\n\n"] * 2
    assert connections == 1
