"""A fake downstream hop: a real websocket server on loopback that answers every step as told.

For what an honest node never does (answer an impossible token id, NaN hidden
states, an error naming someone else), so the head's checks can be watched.
It speaks the hop link (``/v1/link``): each step of a frame gets ``answer``
(an answer entry of ``wire.frames``' format without its id, written as given, so
malformed values go out as they are), plus ``body`` as its bytes; a cancel
and the link's hello get 204.
"""

from __future__ import annotations

import contextlib
import json
import struct
import threading
from collections.abc import Iterator
from typing import Any

from websockets.sync.server import ServerConnection, serve

from nodes_app.runtime.wire.entries import CancelEntry, HelloEntry
from nodes_app.runtime.wire.frames import decode_requests


@contextlib.contextmanager
def fake_hop(answer: dict[str, Any], body: bytes = b"") -> Iterator[str]:
    """Serve the link with this answer to every step; yields the endpoint URL."""

    def handler(websocket: ServerConnection) -> None:
        for message in websocket:
            assert isinstance(message, bytes)
            entries: list[dict[str, Any]] = []
            bodies = b""
            for entry in decode_requests(message):
                if isinstance(entry, CancelEntry | HelloEntry):
                    entries.append({"id": entry.step_id, "status": 204})
                    continue
                entries.append(
                    {**answer, "id": entry.step_id, **({"bytes": len(body)} if body else {})}
                )
                bodies += body
            header = json.dumps({"answers": entries}).encode()
            websocket.send(struct.pack("<I", len(header)) + header + bodies)

    with serve(handler, "127.0.0.1", 0, compression=None) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
        finally:
            server.shutdown()
