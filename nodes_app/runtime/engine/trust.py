"""What a node obeys: plans the tracker signed, and steps that carry their session's capability.

A node pins one tracker key (fetched at registration, or given by its
operator). The head runs ``/v1/generate`` only for a valid, unexpired plan
signed by that key in which it is hop 0. A downstream hop opens a session
only for a step at position 0 that carries such a plan naming this node with
exactly the step's layers, and a capability: a secret the head chose for
that hop session, of which the hop keeps only a SHA-256 hash. Every later
step and the session's ``DELETE`` must present it. A signed plan opens at
most one session on a node: its signature is remembered until it expires.
What that session may hold is the plan's to say, not the head's
(:class:`Grant`): a step that opens it asking more positions than the plan
grants is refused (403 ``plan_exceeded``), and so is a signed plan that
sets no bounds (403 ``plan_unbounded``).

Everything here runs on a request's headers (or the generate body) before a
session slot is taken or a step's body is read, and the ed25519 check runs
once per session; a later step costs one hash and one constant-time compare.

``dev_open`` (``--dev-open``, for tests and benchmarks only) is the node of
old: unsigned plans and capability-less steps are served. A node with no
pinned key and not open refuses every plan.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.limits import CAPABILITY, MAX_PLAN_VALIDITY, PLAN
from nodes_app.protocol.signed_plan import SignedPlan, capability_valid
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.shared.signing import public_key_from_hex, verify_plan

DEV_OPEN_HELP = (
    "FOR TESTS AND BENCHMARKS ONLY: serve unsigned plans and steps without a session "
    "capability, from anyone (off by default: the node obeys only plans signed by its tracker)"
)

# Plans a node remembers as used (each until it expires): far more than any
# tracker signs in MAX_PLAN_VALIDITY seconds for one node.
MAX_REMEMBERED_PLANS = 100_000


def tracker_key_argument(value: str) -> str:
    """``--tracker-key``'s argparse type: an ed25519 public key in hex, lower-cased."""
    try:
        public_key_from_hex(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value.lower()


def new_capability() -> str:
    """A fresh session capability: 32 random bytes, hex."""
    return secrets.token_hex(32)


def capability_hash(capability: str) -> bytes:
    return hashlib.sha256(capability.encode()).digest()


@dataclass(frozen=True)
class Grant:
    """What a step's credentials let it do, as admission found them.

    ``capability``: the SHA-256 of the capability it presented (None: none).
    For a step that opens a session under a signed plan, what that session
    may hold, from the plan: ``max_positions``, ``ends_at`` (unix seconds)
    and ``idle_seconds``, and the ``prefix_scope`` its state may be shared in;
    0 where nothing bounds it (a dev-open node, or a
    later step, whose session already holds its plan's bounds).
    """

    capability: bytes | None = None
    max_positions: int = 0
    ends_at: int = 0
    idle_seconds: int = 0
    # The plan's prefix scope (ADR-0027); None where no signed plan says (dev-open).
    prefix_scope: str | None = None


def _refuse(message: str, code: str, status: int = 403) -> RuntimeRequestError:
    error_type = "authentication_error" if status == 401 else "permission_error"
    return RuntimeRequestError(message, code=code, status=status, error_type=error_type)


class PlanGate:
    """The node's trust in the tracker: its pinned key, the plans already used, ``dev_open``."""

    def __init__(
        self,
        *,
        tracker_key: str | None = None,
        dev_open: bool = False,
        clock: Callable[[], float] = time.time,
        max_remembered: int = MAX_REMEMBERED_PLANS,
    ) -> None:
        self.dev_open = dev_open
        self._clock = clock
        self._max_remembered = max_remembered
        self._key: Ed25519PublicKey | None = None
        self.tracker_key: str | None = None
        self._used: dict[str, int] = {}
        if tracker_key is not None:
            self.pin(tracker_key)

    def pin(self, tracker_key: str) -> None:
        """Trust plans signed by ``tracker_key`` (hex); ValueError if it is not a key."""
        self._key = public_key_from_hex(tracker_key)
        self.tracker_key = tracker_key

    def admit_plan(self, plan: SignedPlan, *, node_id: str) -> None:
        """Admit the plan of a ``/v1/generate`` on the head ``node_id``; 401/403 if refused.

        Dev-open nodes take any plan, signed or not. Otherwise the plan must
        be sealed (:meth:`verify`), have ``node_id`` as hop 0, and not have
        been used on this node before; admitting it uses it up.
        """
        if self.dev_open:
            return
        now = self.verify(plan)
        if plan.hops[0].node_id != node_id:
            raise _refuse(f"the plan's hop 0 is not this node ({node_id})", "plan_mismatch")
        self._use(plan, now)

    def verify(self, plan: SignedPlan) -> float:
        """Check the seal: signed by the pinned key, unexpired, not valid for too long.

        Returns the time it was checked at.
        """
        if self._key is None:
            raise _refuse("this node trusts no tracker key yet", "tracker_key_unknown")
        if not plan.signature:
            raise _refuse("this node runs only tracker-signed plans", "plan_required", 401)
        if not verify_plan(self._key, plan.signed_fields(), plan.signature):
            raise _refuse("the plan's signature is not the tracker's", "plan_signature_invalid")
        now = self._clock()
        if plan.expires_at <= now:
            raise _refuse("the plan has expired", "plan_expired")
        if plan.expires_at > now + MAX_PLAN_VALIDITY:
            raise _refuse(
                f"a plan is valid for at most {MAX_PLAN_VALIDITY} s", "plan_validity_too_long"
            )
        if not plan.bounded:
            raise _refuse(
                "the plan does not say what its sessions may hold (positions, end, idle time)",
                "plan_unbounded",
            )
        if plan.ends_at <= now:
            # Unexpired, but its request is over: a session it opened would end at once.
            raise _refuse("the plan's request is over", "plan_expired")
        return now

    def _use(self, plan: SignedPlan, now: float) -> None:
        if plan.signature in self._used:
            raise _refuse("this plan was already used on this node", "plan_replayed")
        if len(self._used) >= self._max_remembered:
            self._used = {sig: until for sig, until in self._used.items() if until > now}
            if len(self._used) >= self._max_remembered:
                raise RuntimeRequestError(
                    "this node is remembering too many plans; retry later",
                    code="node_busy",
                    status=503,
                    error_type="server_error",
                )
        self._used[plan.signature] = plan.expires_at

    def admit_session(
        self,
        headers: Mapping[str, str],
        *,
        node_id: str,
        session_id: str,
        start: int,
        end: int,
        positions: int,
    ) -> Grant:
        """Admit the step that opens a hop session; what its credentials grant it.

        Needs :data:`PLAN` (a signed plan naming this node with exactly
        layers ``start``-``end``, for the request ``session_id`` belongs to:
        ``<request_id>.<suffix>``, granting at least the ``positions`` the
        step asks to reserve or reach) and :data:`CAPABILITY`. A dev-open node
        needs neither, but keeps a capability it is given.
        """
        presented = self._presented(headers)
        if self.dev_open:
            return Grant(presented)
        raw_plan = headers.get(PLAN)
        if not raw_plan:
            raise _refuse(f"opening a session needs {PLAN}", "plan_required", 401)
        try:
            plan = SignedPlan.from_header(raw_plan)
        except ProtocolError as error:
            raise RuntimeRequestError.refusing(error) from None
        now = self.verify(plan)
        # Hop 0 is the head: it takes token ids, never a step.
        hop = next((h for h in plan.hops[1:] if h.node_id == node_id), None)
        if hop is None:
            raise _refuse(f"the plan has no hop on this node ({node_id})", "plan_mismatch")
        if (hop.start_layer, hop.end_layer) != (start, end):
            raise _refuse(
                f"the plan gives this node layers {hop.start_layer}-{hop.end_layer}, "
                f"not {start}-{end}",
                "plan_mismatch",
            )
        prefix = plan.request_id + "."
        if not (session_id.startswith(prefix) and len(session_id) > len(prefix)):
            raise _refuse(
                "a session id is <request_id>.<suffix> of the plan's request", "plan_mismatch"
            )
        if presented is None:
            raise _refuse(f"opening a session needs {CAPABILITY}", "capability_required", 401)
        if positions > plan.max_positions:
            raise _refuse(
                f"the step asks for {positions} positions; the plan grants {plan.max_positions}",
                "plan_exceeded",
            )
        self._use(plan, now)
        return Grant(
            presented, plan.max_positions, plan.ends_at, plan.idle_seconds, plan.prefix_scope
        )

    def _presented(self, headers: Mapping[str, str]) -> bytes | None:
        capability = headers.get(CAPABILITY)
        if capability is None:
            return None
        if not capability_valid(capability):
            raise _refuse(f"{CAPABILITY} must be 64 hex digits", "capability_invalid")
        return capability_hash(capability)

    def check_capability(self, headers: Mapping[str, str], held: bytes | None) -> bytes | None:
        """Admit a step or DELETE of a session whose capability hash is ``held``.

        A session opened without a capability (dev-open) admits anyone.
        Returns the presented hash (None when none was sent).
        """
        presented = self._presented(headers)
        if held is None:
            return presented
        if presented is None:
            raise _refuse(f"this session needs its {CAPABILITY}", "capability_required", 401)
        if not hmac.compare_digest(presented, held):
            raise _refuse("wrong capability for this session", "capability_invalid")
        return presented
