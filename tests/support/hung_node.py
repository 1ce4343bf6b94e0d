"""A hung node: a real HTTP server, registered like a node, that takes work and never answers.

It registers under a wallet of its own, proves its endpoint when the tracker
challenges it, answers health checks, and then hangs on the work itself: a
hop link (``/v1/link``) is accepted (the websocket handshake) and its frames
are read and never answered (its hello first: a head finds it hung there,
within the step's deadline); a ``/v1/generate`` is accepted (200, the role
frame) and then goes silent. It holds every such connection open until
:meth:`HungNode.release` (or stop), which closes them unanswered. It runs in
threads of the test process.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.protocol.frames import ChunkFrame
from nodes_app.protocol.limits import LINK_PATH
from nodes_app.protocol.sse import sse_event
from tests.support.fake_node import NodeHandler, serve_node
from tracker_app.localnet.stand_in_nodes import signed_registration


def websocket_accept(key: str) -> str:
    """The handshake's ``Sec-WebSocket-Accept`` for the client's key (RFC 6455)."""
    digest = hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
    return base64.b64encode(digest).decode()


@dataclass
class HungNode:
    """A node over layers ``start``-``end`` of the tiny model that never answers work."""

    start: int = 0
    end: int = 3
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    endpoint: str = ""
    node_id: str = ""
    token: str = ""
    # Set once a step or a generate reached it (the route really went through it).
    asked: threading.Event = field(default_factory=threading.Event)
    _released: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None

    def start_serving(self) -> HungNode:
        class Handler(NodeHandler):
            node = self

            def do_GET(self) -> None:
                if self.path != LINK_PATH:
                    super().do_GET()
                    return
                key = self.headers.get("Sec-WebSocket-Key", "")
                self.send_response(101)
                self.send_header("Upgrade", "websocket")
                self.send_header("Connection", "Upgrade")
                self.send_header("Sec-WebSocket-Accept", websocket_accept(key))
                self.end_headers()
                self.wfile.flush()
                # The first frame's bytes: work reached this node.
                self.connection.settimeout(None)
                if self.rfile.read1(65536):
                    self.node.asked.set()
                self.node._released.wait()
                self.close_connection = True

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/challenge":
                    self.answer_challenge(json.loads(body)["nonce"])
                    return
                if self.path == "/v1/generate":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    role = ChunkFrame(role="assistant")
                    self.wfile.write(
                        sse_event(
                            role.to_json(completion_id="hung", created=1, model="tiny-random-llama")
                        )
                    )
                    self.wfile.flush()
                self.node.asked.set()
                self.node._released.wait()
                self.close_connection = True

        self._server, self.endpoint = serve_node(Handler)
        return self

    @property
    def wallet(self) -> str:
        return str(signed_registration(self.key)["wallet"])

    def hop(self) -> dict[str, Any]:
        """This node as a hop of a plan (``node_id`` empty until it registers)."""
        return {
            "node_id": self.node_id or "hung",
            "endpoint": self.endpoint,
            "start_layer": self.start,
            "end_layer": self.end,
        }

    def register(self, tracker_url: str, *, benchmark_tps: float) -> str:
        """Register with the tracker over its layers, claiming ``benchmark_tps``; its node id."""
        body = signed_registration(
            self.key,
            endpoint=self.endpoint,
            shard_start=self.start,
            shard_end=self.end,
            benchmark_tps=benchmark_tps,
        )
        response = httpx.post(f"{tracker_url}/api/nodes/register", json=body, timeout=30)
        assert response.status_code == 201, response.text
        self.node_id = str(response.json()["node_id"])
        self.token = str(response.json()["node_token"])
        return self.node_id

    def deregister(self, tracker_url: str) -> None:
        response = httpx.post(
            f"{tracker_url}/api/nodes/{self.node_id}/deregister",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )
        assert response.status_code in (204, 404), response.text

    def release(self) -> None:
        """Close every connection it holds, unanswered."""
        self._released.set()

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
