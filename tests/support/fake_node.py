"""A dishonest node for attack tests: a small real HTTP server registered with a real tracker.

It registers under a wallet of its own (signed like a node), proves its
endpoint when the tracker challenges it (``POST /v1/challenge``: the wallet
signs ``b"meshnet-endpoint-challenge-v1\\n" + nonce + b"\\n" + endpoint``), and
answers ``/v1/generate`` with whatever its ``behaviour`` says: a well-formed
stream whose usage claims ``reported_prompt_tokens``, a 400 with any code, a
503 (busy, whatever its load), ``: step`` comments and never a token, or a
stream paced one token per ``gap`` seconds that holds its session (and its
share of the head's ``kv_budget``, if it has one) until it ends or its
reader leaves. It runs in a thread of the test process; nothing in it
touches the tracker's database.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.protocol.frames import ChunkFrame
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.sse import SSE_DONE, sse_event
from nodes_app.protocol.usage import Usage
from tracker_app.localnet.stand_in_nodes import signed_registration

CHALLENGE_DOMAIN = b"meshnet-endpoint-challenge-v1\n"
TEXT_TOKEN = 97  # "a" in the tiny model's byte vocabulary
# What a fake head's session reserves besides its max_tokens (its prompt, roughly).
SESSION_OVERHEAD = 64


def challenge_signature(key: Ed25519PrivateKey, nonce: str, endpoint: str) -> str:
    """The endpoint proof an honest node gives for ``nonce`` (see the module docstring)."""
    return key.sign(CHALLENGE_DOMAIN + nonce.encode() + b"\n" + endpoint.encode()).hex()


class NodeHandler(BaseHTTPRequestHandler):
    """What every fake node answers as a real one does: health, session DELETE and
    endpoint challenges. A subclass sets ``node`` (``node_id``, ``key``, ``wallet``,
    ``endpoint``) and answers the work in ``do_POST``."""

    protocol_version = "HTTP/1.1"
    node: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.json(200, {"status": "ok", "node_id": self.node.node_id})

    def do_DELETE(self) -> None:
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def answer_challenge(self, nonce: str) -> None:
        signature = challenge_signature(self.node.key, nonce, self.node.endpoint)
        self.json(200, {"wallet": self.node.wallet, "signature": signature})

    def json(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def serve_node(handler: type[NodeHandler]) -> tuple[ThreadingHTTPServer, str]:
    """``handler`` served on a free loopback port in a daemon thread; the server and its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@dataclass
class Behaviour:
    """What the fake head does with the next ``/v1/generate``."""

    refuse: bool = False  # answer 400 as if the request were invalid…
    refuse_code: str = "context_length_exceeded"  # …with this code
    reported_prompt_tokens: int = 10000
    busy: bool = False  # answer 503, as a node at its session cap does
    comments: bool = False  # stream ": step" comments every ``gap`` s, never a token
    gap: float = 0.0  # seconds between two streamed events (0: the whole answer at once)


@dataclass
class FakeHead:
    """A fake head over the tiny model's whole range, at ``endpoint``."""

    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    behaviour: Behaviour = field(default_factory=Behaviour)
    generate_calls: int = 0
    # KV tokens it admits sessions for, each reserving max_tokens + SESSION_OVERHEAD
    # (None: no limit); past it, 503 as a real node's KV budget answers.
    kv_budget: int | None = None
    reserved: int = 0
    endpoint: str = ""
    node_id: str = ""
    node_token: str = ""
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> FakeHead:
        head = self

        class Handler(NodeHandler):
            node = head

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/v1/challenge":
                    self.answer_challenge(body["nonce"])
                elif self.path == "/v1/generate":
                    head.generate_calls += 1
                    self._generate(GenerateRequest.parse(body))
                else:
                    self.json(404, {"error": {"message": "no", "type": "x", "code": "x"}})

            def _generate(self, request: GenerateRequest) -> None:
                behaviour = head.behaviour
                if behaviour.refuse:
                    refusal = {"message": "too long", "type": "invalid_request_error"}
                    self.json(400, {"error": {**refusal, "code": behaviour.refuse_code}})
                    return
                reservation = request.max_tokens + SESSION_OVERHEAD
                if behaviour.busy or not head.admit(reservation):
                    self.json(503, {"error": {"message": "full", "type": "x", "code": "busy"}})
                    return
                try:
                    if behaviour.comments or behaviour.gap:
                        self._paced(request, behaviour)
                    else:
                        self._whole(request)
                finally:
                    head.free(reservation)

            def _paced(self, request: GenerateRequest, behaviour: Behaviour) -> None:
                """One event per ``gap`` s until the answer ends or its reader leaves."""
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()

                def event(frame: ChunkFrame) -> bytes:
                    return sse_event(
                        frame.to_json(completion_id="fake", created=1, model=request.model)
                    )

                tokens = request.max_tokens - len(request.resume_token_ids)
                try:
                    self.wfile.write(event(ChunkFrame(role="assistant")))
                    for index in range(tokens):
                        time.sleep(behaviour.gap)
                        if behaviour.comments:
                            self.wfile.write(b": step\n\n")
                            continue
                        last = index == tokens - 1
                        frame = ChunkFrame(
                            content="a",
                            token_ids=(TEXT_TOKEN,),
                            finish_reason="length" if last else None,
                            usage=Usage(1, request.max_tokens) if last else None,
                        )
                        self.wfile.write(event(frame))
                    while behaviour.comments:  # never a token, as long as it is read
                        time.sleep(behaviour.gap)
                        self.wfile.write(b": step\n\n")
                    self.wfile.write(sse_event(SSE_DONE))
                except OSError:  # the reader left
                    return

            def _whole(self, request: GenerateRequest) -> None:
                tokens = request.max_tokens - len(request.resume_token_ids)
                usage = Usage(head.behaviour.reported_prompt_tokens, request.max_tokens)
                frames = [ChunkFrame(role="assistant")]
                frames += [ChunkFrame(content="a", token_ids=(TEXT_TOKEN,))] * (tokens - 1)
                frames.append(
                    ChunkFrame(
                        content="a", token_ids=(TEXT_TOKEN,), finish_reason="length", usage=usage
                    )
                )
                payload = b"".join(
                    sse_event(f.to_json(completion_id="fake", created=1, model=request.model))
                    for f in frames
                )
                payload += sse_event(SSE_DONE)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server, self.endpoint = serve_node(Handler)
        return self

    def admit(self, reservation: int) -> bool:
        """Take ``reservation`` KV tokens of the budget, if they are free."""
        with self._lock:
            if self.kv_budget is not None and self.reserved + reservation > self.kv_budget:
                return False
            self.reserved += reservation
            return True

    def free(self, reservation: int) -> None:
        with self._lock:
            self.reserved -= reservation

    @property
    def wallet(self) -> str:
        return str(signed_registration(self.key)["wallet"])

    def register(self, tracker_url: str, *, benchmark_tps: float) -> str:
        """Register with the tracker as a whole-model tiny node claiming ``benchmark_tps``."""
        body = signed_registration(self.key, endpoint=self.endpoint, benchmark_tps=benchmark_tps)
        response = httpx.post(f"{tracker_url}/api/nodes/register", json=body, timeout=30)
        assert response.status_code == 201, response.text
        self.node_id = str(response.json()["node_id"])
        self.node_token = str(response.json()["node_token"])
        return self.node_id

    def deregister(self, tracker_url: str) -> None:
        """Leave the network, as a node shutting down does."""
        response = httpx.post(
            f"{tracker_url}/api/nodes/{self.node_id}/deregister",
            headers={"Authorization": f"Bearer {self.node_token}"},
            timeout=30,
        )
        assert response.status_code == 204, response.text

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
