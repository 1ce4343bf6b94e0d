"""A decoy endpoint: a plain HTTP server that records who calls it and answers an error.

It stands for what an attacker points a node at (a cloud metadata address,
an internal service, another node's endpoint): tests check whether a node
contacted it, and that the text it answers never reaches a client.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tracker_app.localnet import LOOPBACK

MARKER = "DECOY-SECRET-7f3a metadata token"


@dataclass
class Decoy:
    """The decoy at ``endpoint``; ``calls`` lists ``"METHOD path"`` of every request it got."""

    endpoint: str
    calls: list[str] = field(default_factory=list)


@contextmanager
def running_decoy() -> Iterator[Decoy]:
    """A decoy on a free loopback port answering 500 with :data:`MARKER` in its body."""
    body = json.dumps({"error": {"message": MARKER, "code": MARKER}}).encode()
    decoy = Decoy(endpoint="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            decoy.calls.append(f"{self.command} {self.path}")
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            self.send_response(500)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    decoy.endpoint = f"http://{LOOPBACK}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield decoy
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
