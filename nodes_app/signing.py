"""Node wallets: ed25519 keys that sign registrations.

A wallet is the hex of an ed25519 public key. A node signs the canonical form
of its registration fields, so nobody can register a node under another's
wallet. This module imports neither Django nor torch: the tracker verifies
with it and the node runtime signs with it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

_DOMAIN = b"meshnet-node-registration-v1\n"


def canonical_message(fields: Mapping[str, Any]) -> bytes:
    """The exact bytes a registration signature covers."""
    body = json.dumps(dict(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return _DOMAIN + body.encode()


def wallet_of(private_key: Ed25519PrivateKey) -> str:
    raw = private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return raw.hex()


def sign_registration(private_key: Ed25519PrivateKey, fields: Mapping[str, Any]) -> str:
    return private_key.sign(canonical_message(fields)).hex()


def verify_registration(wallet: str, fields: Mapping[str, Any], signature: str) -> bool:
    """True when ``signature`` is the wallet owner's signature over ``fields``."""
    try:
        public_key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(wallet))
        public_key.verify(bytes.fromhex(signature), canonical_message(fields))
    except (ValueError, InvalidSignature):
        return False
    return True


def load_or_create_wallet(path: Path) -> Ed25519PrivateKey:
    """Read the raw private key (hex) at ``path``, creating it (mode 0600) if missing."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        raw = key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(raw.hex() + "\n")
        return key
    try:
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(path.read_text().strip()))
    except ValueError:
        raise ValueError(f"{path} does not hold a hex ed25519 private key") from None
