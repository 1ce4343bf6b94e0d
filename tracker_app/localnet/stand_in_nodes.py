"""Nodes that only need to exist: endpoints that answer the tracker's challenge honestly,
without a model behind them, and the signed registrations such nodes send.

``ChallengeResponder`` serves real HTTP on loopback ports. Each wallet key
given to ``endpoint_for`` gets an endpoint of its own, a port of its own
(``http://127.0.0.1:PORT``: one port is one node, ADR-0008), whose
``POST /v1/challenge`` answers as a node with that wallet would; ``url`` is a
port where every path answers 404. ``hand_over`` makes an endpoint answer for
another wallet, under any spelling of it (``http://localhost:PORT``) or a
path on it, as a malicious operator's node would. Tests that register nodes
which serve nothing use it so the registration proves its endpoint;
``answered`` counts the challenges each endpoint received.
:func:`proven_registration` is a registration body at such an endpoint.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.shared.signing import (
    canonical_endpoint,
    sign_challenge,
    sign_registration,
    wallet_of,
)
from tracker_app.localnet.processes import LOOPBACK


class ChallengeResponder:
    def __init__(self) -> None:
        # Per port: path prefix -> (key, the endpoint spelling it signs over).
        self._answers: dict[int, dict[str, tuple[Ed25519PrivateKey, str]]] = {}
        self.answered: Counter[str] = Counter()
        self.connections = 0
        self._servers: list[ThreadingHTTPServer] = []
        self._selector = selectors.DefaultSelector()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.url = self._listen()

    def _listen(self) -> str:
        """A new port on this responder, served by its one thread; its URL."""
        responder = self

        class Handler(BaseHTTPRequestHandler):
            def setup(self) -> None:
                responder.connections += 1
                super().setup()

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                port = int(self.server.server_address[1])  # type: ignore[index]
                prefix = self.path.removesuffix("/v1/challenge")
                answer = responder._answers.get(port, {}).get(prefix)
                if answer is None or not self.path.endswith("/v1/challenge"):
                    self._answer(404, {"error": {"message": "no such node", "code": "nope"}})
                    return
                key, spelling = answer
                responder.answered[f"http://{LOOPBACK}:{port}{prefix}"] += 1
                signature = sign_challenge(key, str(body.get("nonce", "")), spelling)
                self._answer(200, {"wallet": wallet_of(key), "signature": signature})

            def _answer(self, status: int, payload: object) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        server.daemon_threads = True
        self._servers.append(server)
        self._selector.register(server.socket, selectors.EVENT_READ, server)
        return f"http://{LOOPBACK}:{server.server_address[1]}"

    def _serve(self) -> None:
        """Accept on every port (each request then runs in a thread of its own)."""
        while not self._stopping.is_set():
            for ready, _ in self._selector.select(timeout=0.1):
                server: ThreadingHTTPServer = ready.data
                server._handle_request_noblock()  # type: ignore[attr-defined]

    def endpoint_for(self, key: Ed25519PrivateKey) -> str:
        """An endpoint of this responder that proves ``key``'s wallet (the same one each
        time)."""
        for port, answers in self._answers.items():
            known = answers.get("")
            if known is not None and wallet_of(known[0]) == wallet_of(key):
                return f"http://{LOOPBACK}:{port}"
        return self.new_endpoint(key)

    def new_endpoint(self, key: Ed25519PrivateKey) -> str:
        """Another endpoint, on a new port, that proves ``key``'s wallet."""
        endpoint = self._listen()
        self.hand_over(endpoint, key)
        return endpoint

    def hand_over(self, endpoint: str, key: Ed25519PrivateKey) -> None:
        """``endpoint`` answers for ``key``'s wallet from now on (the operator changed
        wallets). Any spelling of one of this responder's ports works, with a path
        or not: the answer signs over ``endpoint`` as written, as a node advertising
        it would."""
        parts = urlsplit(endpoint)
        port = parts.port or 80
        self._answers.setdefault(port, {})[parts.path.rstrip("/")] = (
            key,
            canonical_endpoint(endpoint),
        )

    def forget(self, endpoint: str) -> None:
        """``endpoint`` stops answering challenges (404 from now on), like a node replaced."""
        parts = urlsplit(endpoint)
        self._answers.get(parts.port or 80, {}).pop(parts.path.rstrip("/"), None)

    def start(self) -> ChallengeResponder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        for server in self._servers:
            server.server_close()
        self._selector.close()


@contextlib.contextmanager
def challenge_responder() -> Iterator[ChallengeResponder]:
    """A running responder, stopped after."""
    responder = ChallengeResponder().start()
    try:
        yield responder
    finally:
        responder.stop()


def signed_registration(
    key: Ed25519PrivateKey | None = None, *, timestamp: float | None = None, **overrides: Any
) -> dict[str, Any]:
    """A registration body for the tiny model, signed by ``key`` (a new wallet by default)."""
    key = key or Ed25519PrivateKey.generate()
    fields: dict[str, Any] = {
        "wallet": wallet_of(key),
        "endpoint": "http://127.0.0.1:7001",
        "model": "tiny-random-llama",
        "shard_start": 0,
        "shard_end": 3,
        "num_layers": 4,
        "hardware": "cpu",
        "device_name": "test cpu",
        "benchmark_tps": 25.0,
        "timestamp": time.time() if timestamp is None else timestamp,
    }
    fields.update(overrides)
    return {**fields, "signature": sign_registration(key, fields)}


def proven_registration(
    responder: ChallengeResponder, key: Ed25519PrivateKey | None = None, **overrides: Any
) -> dict[str, Any]:
    """``signed_registration`` at an endpoint of ``responder`` that proves ``key``'s wallet.

    The same key always gets the same endpoint (a restart, a shard change);
    ``endpoint=`` overrides it.
    """
    key = key or Ed25519PrivateKey.generate()
    overrides.setdefault("endpoint", responder.endpoint_for(key))
    return signed_registration(key, **overrides)
