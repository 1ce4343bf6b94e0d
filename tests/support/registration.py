"""Build signed registrations the way a node does."""

from __future__ import annotations

import time
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.signing import sign_registration, wallet_of


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
