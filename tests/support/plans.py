"""Plans as a tracker signs them, for tests that call nodes directly (or forge a plan)."""

from __future__ import annotations

import dataclasses
import secrets
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.signed_plan import PlanHop, SignedPlan
from nodes_app.shared.signing import load_or_create_wallet, sign_plan

# What a test's plan lets each session hold unless the test says: more positions than
# any test model's context, and the life and idle time nodes gave every session before
# plans bounded them.
GENEROUS_POSITIONS = 1 << 16
GENEROUS_SECONDS = 600


def tracker_key(key_file: Path | None) -> Ed25519PrivateKey:
    """The signing key a tracker keeps in ``key_file`` (created if it is not there yet)."""
    assert key_file is not None, "this network names no tracker key file"
    return load_or_create_wallet(key_file)


def signed_plan(
    key: Ed25519PrivateKey,
    *,
    request_id: str,
    model: str,
    hops: list[dict[str, Any]],
    expires_at: float | None = None,
    max_positions: int = GENEROUS_POSITIONS,
    ends_at: float | None = None,
    idle_seconds: int = GENEROUS_SECONDS,
    prefix_scope: str = "",
) -> SignedPlan:
    """A plan signed by ``key`` with a fresh nonce; ``expires_at`` defaults to a minute
    from now; what its sessions may hold, to generous bounds (``ends_at``: ten minutes
    from now); ``prefix_scope``: whose prefix cache its sessions share (none unless set)."""
    now = time.time()
    plan = SignedPlan(
        request_id=request_id,
        model=model,
        hops=tuple(PlanHop.parse(hop, i) for i, hop in enumerate(hops)),
        expires_at=int(now + 60 if expires_at is None else expires_at),
        nonce=secrets.token_hex(16),
        max_positions=max_positions,
        ends_at=int(now + GENEROUS_SECONDS if ends_at is None else ends_at),
        idle_seconds=idle_seconds,
        prefix_scope=prefix_scope,
    )
    return dataclasses.replace(plan, signature=sign_plan(key, plan.signed_fields()))


def signed(
    body: dict[str, Any], key: Ed25519PrivateKey, *, expires_at: float | None = None
) -> dict[str, Any]:
    """``body`` (a ``/v1/generate`` body) with its plan signed by ``key``, as a tracker would
    (its ``prefix_scope`` too, when the body's plan names one)."""
    request = GenerateRequest.parse(body)
    plan = signed_plan(
        key,
        request_id=request.request_id,
        model=request.model,
        hops=body["plan"]["hops"],
        expires_at=expires_at,
        prefix_scope=body["plan"].get("prefix_scope", ""),
    )
    return {**body, "plan": {**body["plan"], **seal_of(plan)}}


def seal_of(plan: SignedPlan) -> dict[str, Any]:
    """What a generate body's ``plan`` carries besides its model and hops: the tracker's
    seal (expiry, bounds, nonce, signature)."""
    fields = plan.signed_fields()
    for route in ("request_id", "model", "hops"):
        del fields[route]
    return {**fields, "signature": plan.signature}
