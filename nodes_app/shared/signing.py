"""ed25519 signatures: node wallets sign registrations and endpoint challenges, the
tracker signs plans.

A wallet is the hex of an ed25519 public key. A node signs the canonical form
of its registration fields, so nobody can register a node under another's
wallet, and answers the tracker's endpoint challenge (a fresh nonce) by
signing it together with the endpoint it serves at, so nobody can register
an endpoint whose node holds another wallet (ADR-0008). The tracker signs
each plan (``nodes_app.protocol.signed_plan.SignedPlan``) with its own key, which nodes
pin, so a node acts only on routes the tracker chose. Each kind of message
has its own domain prefix, so a signature of one kind is never valid as
another. This module imports neither Django nor torch: both sides sign and
verify with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from meshnet_site.files import create_once

_DOMAIN = b"meshnet-node-registration-v1\n"
_PLAN_DOMAIN = b"meshnet-plan-v1\n"
_CHALLENGE_DOMAIN = b"meshnet-endpoint-challenge-v1\n"
_NONCE = re.compile(r"[0-9a-f]{64}")
_DEFAULT_PORTS = {"http": 80, "https": 443}


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

    Several processes, and several threads of one process, may start at once
    on one key (trackers and a worker share the tracker key; a tracker's first
    requests come in side by side): ``create_once`` lets one key win whole.
    """
    if not path.exists():
        raw = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        create_once(path, raw.hex() + "\n")
    try:
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(path.read_text().strip()))
    except ValueError:
        raise ValueError(f"{path} does not hold a hex ed25519 private key") from None


def canonical_endpoint(url: str) -> str:
    """One spelling of a node endpoint: ``scheme://host:port[/path]``.

    Scheme and host lowercased, the port written out, no trailing slash, so
    ``http://Node.lan`` and ``http://node.lan:80/`` name the same endpoint
    (uniqueness and bans compare this form). Raises ValueError for anything
    but an http(s) URL with a host and no credentials, query or fragment.
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError("an endpoint is an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError("an endpoint names a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("an endpoint carries no credentials")
    if parts.query or parts.fragment:
        raise ValueError("an endpoint has no query or fragment")
    port = parts.port or _DEFAULT_PORTS[scheme]  # .port raises ValueError when malformed
    host = parts.hostname.rstrip(".")
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}{parts.path.rstrip('/')}"


def is_challenge_nonce(nonce: object) -> TypeGuard[str]:
    """True for a well-formed challenge nonce: 64 lowercase hex digits (32 random bytes)."""
    return isinstance(nonce, str) and _NONCE.fullmatch(nonce) is not None


def challenge_message(nonce: str, endpoint: str) -> bytes:
    """The exact bytes an endpoint-challenge signature covers.

    The endpoint is part of it, so an answer obtained from one endpoint does
    not prove another; it is taken in its canonical form so both sides agree
    however the operator spelled it.
    """
    return _CHALLENGE_DOMAIN + nonce.encode() + b"\n" + canonical_endpoint(endpoint).encode()


def sign_challenge(private_key: Ed25519PrivateKey, nonce: str, endpoint: str) -> str:
    """The node's answer to the tracker's challenge ``nonce`` at ``endpoint`` (hex)."""
    return private_key.sign(challenge_message(nonce, endpoint)).hex()


def verify_challenge(wallet: str, nonce: str, endpoint: str, signature: str) -> bool:
    """True when ``signature`` is ``wallet``'s answer to ``nonce`` at ``endpoint``."""
    try:
        public_key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(wallet))
        public_key.verify(bytes.fromhex(signature), challenge_message(nonce, endpoint))
    except (ValueError, InvalidSignature):
        return False
    return True
