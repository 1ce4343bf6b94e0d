"""Nodes that only need to exist: endpoints that answer the tracker's challenge honestly,
without a model behind them, and the signed registrations such nodes send.

``ChallengeResponder`` is a real HTTP server on a loopback port. Each wallet
key given to ``endpoint_for`` gets an endpoint of its own on it
(``http://127.0.0.1:PORT/w/<n>``) whose ``POST …/v1/challenge`` answers as a
node with that wallet would; any other path answers 404. Tests that register
nodes which serve nothing use it so the registration proves its endpoint;
``answered`` counts the challenges each endpoint received.
:func:`proven_registration` is a registration body at such an endpoint.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.signing import sign_challenge, sign_registration, wallet_of
from tracker_app.localnet.processes import LOOPBACK


class ChallengeResponder:
    def __init__(self) -> None:
        self._keys: dict[str, Ed25519PrivateKey] = {}
        self._paths = itertools.count()
        self.answered: Counter[str] = Counter()
        self.connections = 0
        responder = self

        class Handler(BaseHTTPRequestHandler):
            def setup(self) -> None:
                responder.connections += 1
                super().setup()

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                endpoint = responder.url + self.path.removesuffix("/v1/challenge")
                key = responder._keys.get(endpoint)
                if key is None or not self.path.endswith("/v1/challenge"):
                    self._answer(404, {"error": {"message": "no such node", "code": "nope"}})
                    return
                responder.answered[endpoint] += 1
                signature = sign_challenge(key, str(body.get("nonce", "")), endpoint)
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

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{LOOPBACK}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def endpoint_for(self, key: Ed25519PrivateKey) -> str:
        """An endpoint on this server that proves ``key``'s wallet (the same one each time)."""
        for endpoint, known in self._keys.items():
            if wallet_of(known) == wallet_of(key):
                return endpoint
        return self.new_endpoint(key)

    def new_endpoint(self, key: Ed25519PrivateKey) -> str:
        """Another endpoint on this server that proves ``key``'s wallet."""
        endpoint = f"{self.url}/w/{next(self._paths)}"
        self._keys[endpoint] = key
        return endpoint

    def hand_over(self, endpoint: str, key: Ed25519PrivateKey) -> None:
        """``endpoint`` answers for ``key``'s wallet from now on (the operator changed wallets)."""
        self._keys[endpoint] = key

    def forget(self, endpoint: str) -> None:
        """``endpoint`` stops answering challenges (404 from now on), like a node replaced."""
        self._keys.pop(endpoint, None)

    def start(self) -> ChallengeResponder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


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
