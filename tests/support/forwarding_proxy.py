"""A reverse proxy in front of a tracker, as a load balancer of README's "Scaling out" is.

A real HTTP server on a loopback port that forwards each GET to its target
and adds the headers such balancers add (``X-Forwarded-For`` with the
client's address, ``X-Forwarded-Proto``), or none (``add_headers=False``:
a TCP balancer, or a proxy left at its defaults). The tracker then sees every
client arrive from the proxy's address.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from tracker_app.localnet import LOOPBACK


@contextmanager
def forwarding_proxy(target: str, *, add_headers: bool = True) -> Iterator[str]:
    """The URL of a proxy forwarding GETs to ``target``, stopped after."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            headers = {
                name: value
                for name, value in self.headers.items()
                if name.lower() not in ("host", "connection")
            }
            if add_headers:
                headers["X-Forwarded-For"] = self.client_address[0]
                headers["X-Forwarded-Proto"] = "http"
            answer = httpx.get(f"{target}{self.path}", headers=headers, timeout=30)
            self.send_response(answer.status_code)
            self.send_header("Content-Type", answer.headers.get("content-type", "text/plain"))
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
