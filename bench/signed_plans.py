"""A generate request as the tracker would send it: its plan signed with the network's key.

Benches call a head straight (``/v1/generate``) beside the same request through
the tracker; the head obeys only plans signed by the tracker's key (ADR-0002).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

from nodes_app.protocol.generate import GenerateRequest
from nodes_app.shared.signing import load_or_create_wallet, sign_plan


def signed_direct(body: dict[str, Any], key_file: Path) -> dict[str, Any]:
    """``body`` under a fresh request id, its plan signed as the tracker signs one."""
    body = {**body, "request_id": f"bench-{time.monotonic_ns()}"}
    now = int(time.time())
    # What its sessions may hold: the whole context, for as long as any bench run takes.
    bounds = {"max_positions": 1 << 16, "ends_at": now + 600, "idle_seconds": 600}
    body["plan"] = {**body["plan"], "expires_at": now + 60, **bounds, "signature": ""}
    body["plan"]["nonce"] = secrets.token_hex(16)
    fields = GenerateRequest.parse(body).plan.signed_fields()
    body["plan"]["signature"] = sign_plan(load_or_create_wallet(key_file), fields)
    return body
