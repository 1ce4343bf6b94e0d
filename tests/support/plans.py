"""Plans as a tracker signs them, for tests that call a head directly (or forge one)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.protocol import GenerateRequest
from nodes_app.signing import load_or_create_wallet, sign_plan


def tracker_key(key_file: Path | None) -> Ed25519PrivateKey:
    """The signing key a tracker keeps in ``key_file`` (created if it is not there yet)."""
    assert key_file is not None, "this network names no tracker key file"
    return load_or_create_wallet(key_file)


def signed(
    body: dict[str, Any], key: Ed25519PrivateKey, *, expires_at: float | None = None
) -> dict[str, Any]:
    """``body`` (a ``/v1/generate`` body) with its plan signed by ``key``, as a tracker would.

    ``expires_at`` defaults to a minute from now.
    """
    expires = int(time.time() + 60 if expires_at is None else expires_at)
    plan = {**body["plan"], "expires_at": expires, "signature": ""}
    request = GenerateRequest.parse({**body, "plan": plan})
    signature = sign_plan(key, request.plan.signed_fields())
    return {**body, "plan": {**plan, "signature": signature}}
