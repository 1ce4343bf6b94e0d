"""The node's plan gate (``nodes_app.runtime.engine.trust``) alone: which plans it admits, what it
remembers of used ones, and how a session's capability is kept and compared.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.protocol.limits import CAPABILITY, PLAN
from nodes_app.protocol.signed_plan import PlanHop, SignedPlan
from nodes_app.runtime.engine.trust import Grant, PlanGate, capability_hash, new_capability
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.shared.signing import sign_plan, wallet_of
from tests.support.nodes import TINY

TRACKER = Ed25519PrivateKey.generate()
TRACKER_HEX = wallet_of(TRACKER)


def plan(
    *,
    expires_in: float = 60,
    now: float = 1000.0,
    request_id: str = "r",
    max_positions: int = 64,
    idle_seconds: int = 30,
) -> SignedPlan:
    hops = (PlanHop("head", "http://h", 0, 1), PlanHop("tail", "http://t", 2, 3))
    unsigned = SignedPlan(
        request_id,
        TINY,
        hops,
        int(now + expires_in),
        nonce="ab" * 16,
        max_positions=max_positions,
        ends_at=int(now + 300),
        idle_seconds=idle_seconds,
    )
    return dataclasses.replace(unsigned, signature=sign_plan(TRACKER, unsigned.signed_fields()))


def gate_refusal(call: Any) -> RuntimeRequestError:
    with pytest.raises(RuntimeRequestError) as caught:
        call()
    return caught.value


def test_a_node_with_no_tracker_key_and_not_dev_open_refuses_every_plan() -> None:
    closed = PlanGate()

    error = gate_refusal(lambda: closed.admit_plan(plan(now=time.time()), node_id="head"))
    assert (error.status, error.code) == (403, "tracker_key_unknown")
    PlanGate(dev_open=True).admit_plan(SignedPlan("r", TINY, ()), node_id="x")  # no refusal


def test_the_gate_refuses_plans_valid_too_long_and_forgets_used_ones_once_expired() -> None:
    clock = [1000.0]
    gate = PlanGate(tracker_key=TRACKER_HEX, clock=lambda: clock[0], max_remembered=2)

    error = gate_refusal(lambda: gate.admit_plan(plan(expires_in=3600), node_id="head"))
    assert error.code == "plan_validity_too_long"
    gate.admit_plan(plan(request_id="a"), node_id="head")
    gate.admit_plan(plan(request_id="b"), node_id="head")
    assert gate_refusal(lambda: gate.admit_plan(plan(request_id="c"), node_id="head")).status == 503
    clock[0] += 61  # a and b expire: their memory is freed
    gate.admit_plan(plan(request_id="c", now=clock[0]), node_id="head")
    wrong_head = gate_refusal(lambda: gate.admit_plan(plan(now=clock[0]), node_id="tail"))
    assert wrong_head.code == "plan_mismatch"


def test_a_session_capability_is_kept_as_a_hash_and_compared_exactly() -> None:
    gate = PlanGate(tracker_key=TRACKER_HEX)
    mine = new_capability()
    held = capability_hash(mine)

    assert mine.encode() not in held
    assert gate.check_capability({CAPABILITY: mine}, held) == held
    assert gate_refusal(lambda: gate.check_capability({CAPABILITY: "zz"}, held)).code == (
        "capability_invalid"
    )
    assert gate_refusal(lambda: gate.check_capability({}, held)).status == 401


def test_a_plan_grants_its_sessions_its_own_bounds_and_nothing_past_them() -> None:
    clock = [1000.0]
    gate = PlanGate(tracker_key=TRACKER_HEX, clock=lambda: clock[0])
    capability = new_capability()

    def open_tail(sealed: SignedPlan, positions: int) -> Grant:
        headers = {PLAN: sealed.to_header(), CAPABILITY: capability}
        return gate.admit_session(
            headers, node_id="tail", session_id="r.s", start=2, end=3, positions=positions
        )

    greedy = gate_refusal(lambda: open_tail(plan(), positions=65))
    assert (greedy.status, greedy.code) == (403, "plan_exceeded")
    # Refused before the plan is used up: the same plan still opens what it grants.
    # No prefix_scope in the plan: its sessions share no prefix cache ("").
    assert open_tail(plan(), positions=64) == Grant(capability_hash(capability), 64, 1300, 30, "")
    unbounded = gate_refusal(lambda: open_tail(plan(request_id="u", idle_seconds=0), 1))
    assert (unbounded.status, unbounded.code) == (403, "plan_unbounded")
    # Valid to open sessions for another minute, but its request is over (ends_at 1000).
    over = gate_refusal(lambda: open_tail(plan(request_id="o", now=700, expires_in=360), 1))
    assert (over.status, over.code) == (403, "plan_expired")
