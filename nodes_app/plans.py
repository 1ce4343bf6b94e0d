"""The tracker's signing key and the plans it signs with it.

Every tracker and worker of a deployment reads one ed25519 key from
``MESHNET_TRACKER_KEY_FILE`` (created, mode 0600, on first use) and signs
every plan it sends a head with it; nodes pin its public half (published at
``/.well-known/meshnet-tracker-key``) and act on nothing else. A plan is
signed afresh for each send (a retry, a failover, a probe), valid for
``MESHNET_PLAN_VALIDITY`` seconds (that bounds when it may open sessions,
not how long the generation it starts may run) and with a fresh nonce, so
that no two sends share a signature a node would refuse as replayed.

A plan also says what each session it opens may hold (ADR-0002, "What a
plan lets a hop hold"), from what only the tracker knows for sure: the
positions (its own count of the prompt plus ``max_tokens``), and how long
the request can last while the tracker still waits for it (its silence
limit, the longest it lets the head send nothing). A head chooses none of
it, so it cannot make a downstream hop hold more, or longer, than the
request it was given needs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from nodes_app.protocol.generate import GenerateRequest
from nodes_app.shared.signing import load_or_create_wallet, sign_plan, wallet_of


@functools.cache
def _key_at(path: Path) -> Ed25519PrivateKey:
    return load_or_create_wallet(path)


def tracker_signing_key() -> Ed25519PrivateKey:
    """The deployment's plan-signing key (read once per process, created if missing)."""
    return _key_at(Path(settings.MESHNET_TRACKER_KEY_FILE))


def tracker_public_key() -> str:
    """The public half of :func:`tracker_signing_key`, hex: what nodes pin."""
    return wallet_of(tracker_signing_key())


# How many of the tracker's silence limits a session may wait for its next step.
# An honest head sends the tracker a frame (a token, or a comment) after every
# step, each within one silence limit of the one before, or the tracker drops it
# (and the head cancels). Between a hop's answer to step t and step t + 1 reaching
# it, the head sends frame t and then frame t + 1 comes: the gap lies between
# frames t - 1 and t + 1, under two silence limits.
IDLE_SILENCES = 2


@dataclass(frozen=True)
class SessionBounds:
    """What a plan lets each session it opens hold (``SignedPlan``'s fields of that name)."""

    max_positions: int
    ends_at: int
    idle_seconds: int


def session_bounds(
    request: GenerateRequest,
    *,
    prompt_tokens: int,
    silence: float,
    issued: float,
    lasts: float | None = None,
) -> SessionBounds:
    """What the plan of ``request``, signed at ``issued``, lets each of its sessions hold.

    ``prompt_tokens`` is the tracker's count of the prompt (an upper bound
    where it cannot count exactly); ``silence`` the seconds the tracker lets
    the head send nothing for this send (``head_stream.silence_limit``). Each
    session may reach the prompt plus ``max_tokens`` positions (the budget of
    the whole completion: a replay's resumed tokens are in it), wait at most
    :data:`IDLE_SILENCES` silence limits for a step, and live until every
    step still to come could have taken a whole silence limit: the longest
    the tracker lets this send run, a long generation's included, and never
    past ``lasts`` seconds, what the request's own total deadline leaves it.
    """
    steps = 1 + max(0, request.max_tokens - len(request.resume_token_ids))
    runs = steps * silence if lasts is None else min(steps * silence, lasts)
    return SessionBounds(
        max_positions=prompt_tokens + request.max_tokens,
        ends_at=math.ceil(issued + runs),
        idle_seconds=math.ceil(IDLE_SILENCES * silence),
    )


def plan_sign(
    request: GenerateRequest,
    *,
    prompt_tokens: int,
    silence: float,
    lasts: float | None = None,
    now: float | None = None,
) -> GenerateRequest:
    """``request`` with its plan signed by the tracker, valid from ``now`` (default: the
    clock), its sessions bounded by :func:`session_bounds`."""
    issued = time.time() if now is None else now
    bounds = session_bounds(
        request, prompt_tokens=prompt_tokens, silence=silence, issued=issued, lasts=lasts
    )
    sealed = dataclasses.replace(
        request,
        expires_at=math.ceil(issued + settings.MESHNET_PLAN_VALIDITY),
        **dataclasses.asdict(bounds),
        nonce=secrets.token_hex(16),
        signature="",
    )
    signature = sign_plan(tracker_signing_key(), sealed.plan.signed_fields())
    return dataclasses.replace(sealed, signature=signature)
