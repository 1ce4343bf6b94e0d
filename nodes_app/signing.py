"""ed25519 signatures: node wallets sign registrations, the tracker signs plans.

A wallet is the hex of an ed25519 public key. A node signs the canonical form
of its registration fields, so nobody can register a node under another's
wallet. The tracker signs each plan (``nodes_app.protocol.SignedPlan``) with
its own key, which nodes pin, so a node acts only on routes the tracker
chose. Each kind of message has its own domain prefix, so a signature of one
kind is never valid as another. This module imports neither Django nor
torch: both sides sign and verify with it.
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
_PLAN_DOMAIN = b"meshnet-plan-v1\n"


def _canonical(domain: bytes, fields: Mapping[str, Any]) -> bytes:
    body = json.dumps(dict(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return domain + body.encode()


def canonical_message(fields: Mapping[str, Any]) -> bytes:
    """The exact bytes a registration signature covers."""
    return _canonical(_DOMAIN, fields)


def plan_message(fields: Mapping[str, Any]) -> bytes:
    """The exact bytes a plan signature covers (``SignedPlan.signed_fields()``)."""
    return _canonical(_PLAN_DOMAIN, fields)


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


def sign_plan(private_key: Ed25519PrivateKey, fields: Mapping[str, Any]) -> str:
    """The tracker's signature (hex) over a plan's signed fields."""
    return private_key.sign(plan_message(fields)).hex()


def public_key_from_hex(value: str) -> Ed25519PublicKey:
    """An ed25519 public key from its 64 hex digits; ValueError if it is not one."""
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(value))
    except ValueError:
        raise ValueError("an ed25519 public key is 64 hex digits") from None


def verify_plan(public_key: Ed25519PublicKey, fields: Mapping[str, Any], signature: str) -> bool:
    """True when ``signature`` is ``public_key``'s signature over the plan ``fields``."""
    try:
        public_key.verify(bytes.fromhex(signature), plan_message(fields))
    except (ValueError, InvalidSignature):
        return False
    return True


def load_or_create_wallet(path: Path) -> Ed25519PrivateKey:
    """Read the raw private key (hex) at ``path``, creating it (mode 0600) if missing.

    Several processes may start at once on one key (trackers and a worker
    share the tracker key): the key is written whole under a private name and
    linked into place, so the first link wins and nobody reads half a key.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        draft = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(raw.hex() + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    try:
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(path.read_text().strip()))
    except ValueError:
        raise ValueError(f"{path} does not hold a hex ed25519 private key") from None
