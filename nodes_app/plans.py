"""The tracker's signing key and the plans it signs with it.

Every tracker and worker of a deployment reads one ed25519 key from
``MESHNET_TRACKER_KEY_FILE`` (created, mode 0600, on first use) and signs
every plan it sends a head with it; nodes pin its public half (published at
``/.well-known/meshnet-tracker-key``) and act on nothing else. A plan is
signed afresh for each send (a retry, a failover, a probe), valid for
``MESHNET_PLAN_VALIDITY`` seconds (that bounds when it may open sessions,
not how long the generation it starts may run) and with a fresh nonce, so
that no two sends share a signature a node would refuse as replayed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import secrets
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from nodes_app.protocol.generate import GenerateRequest
from nodes_app.signing import load_or_create_wallet, sign_plan, wallet_of


@functools.cache
def _key_at(path: Path) -> Ed25519PrivateKey:
    return load_or_create_wallet(path)


def tracker_signing_key() -> Ed25519PrivateKey:
    """The deployment's plan-signing key (read once per process, created if missing)."""
    return _key_at(Path(settings.MESHNET_TRACKER_KEY_FILE))


def tracker_public_key() -> str:
    """The public half of :func:`tracker_signing_key`, hex: what nodes pin."""
    return wallet_of(tracker_signing_key())


def plan_sign(request: GenerateRequest, *, now: float | None = None) -> GenerateRequest:
    """``request`` with its plan signed by the tracker, valid from ``now`` (default: the clock)."""
    issued = time.time() if now is None else now
    sealed = dataclasses.replace(
        request,
        expires_at=math.ceil(issued + settings.MESHNET_PLAN_VALIDITY),
        nonce=secrets.token_hex(16),
        signature="",
    )
    signature = sign_plan(tracker_signing_key(), sealed.plan.signed_fields())
    return dataclasses.replace(sealed, signature=signature)
