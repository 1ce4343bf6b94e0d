"""Prefix reuse on the wire: claims, kept cancels and their answers, and what a node refuses.

Also the protocol's side of it: a plan's ``prefix_scope`` and the usage
frame's ``cached_tokens``, each read back as sent and refused when malformed.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import pytest

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.limits import PREFIX_MAX_BLOCKS, PREFIX_MAX_SCOPE
from nodes_app.protocol.signed_plan import PlanHop, SignedPlan
from nodes_app.protocol.usage import Usage
from nodes_app.runtime.wire.entries import CancelEntry, ClaimEntry, RefusedEntry, StepAnswer
from nodes_app.runtime.wire.frames import (
    decode_answers,
    decode_requests,
    encode_answers,
    encode_requests,
)
from nodes_app.shared.prefix_chain import block_hashes, chain_seed

HASHES = tuple(block_hashes(chain_seed("tiny", "key-1"), list(range(100))))


def raw_frame(entries: list[dict[str, Any]]) -> bytes:
    """A frame written by hand, as an untrusted head could send it."""
    header = json.dumps({"steps": entries}).encode()
    return struct.pack("<I", len(header)) + header


def test_a_chain_has_one_hash_per_full_block_and_depends_on_its_scope() -> None:
    assert len(HASHES) == 100 // 32
    assert block_hashes(chain_seed("tiny", "key-1"), list(range(64)))[:2] == list(HASHES[:2])
    assert block_hashes(chain_seed("tiny", "key-2"), list(range(100))) != list(HASHES)
    # A block's hash covers every token before it, not its own block alone.
    other = block_hashes(chain_seed("tiny", "key-1"), [1, *range(1, 100)])
    assert other[1] != HASHES[1]


def test_a_claim_and_a_kept_cancel_arrive_as_sent() -> None:
    claim = ClaimEntry(4, "r.1", 2, 3, 96, HASHES, "c" * 64, "plan-text")
    cancel = CancelEntry(5, "r.1", "c" * 64, HASHES)

    assert decode_requests(encode_requests([claim, cancel])) == [claim, cancel]


def test_a_claims_answer_carries_the_blocks_held() -> None:
    answers = [StepAnswer(4, blocks=2, exact=True), StepAnswer(5, blocks=0, exact=False)]

    decoded = decode_answers(encode_answers(answers))

    assert [(a.step_id, a.blocks, a.exact) for a in decoded] == [(4, 2, True), (5, 0, False)]


CLAIM = {"id": 1, "claim": "r.1", "start": 2, "end": 3, "reserve": 64, "hashes": list(HASHES)}


@pytest.mark.parametrize(
    "changes",
    [
        {"hashes": ["0" * 32] * (PREFIX_MAX_BLOCKS + 1)},
        {"hashes": ["not-hex" + "0" * 25]},
        {"hashes": ["0" * 31]},
        {"hashes": "0" * 32},
        {"start": -1},
        {"start": 3, "end": 2},
        {"reserve": "many"},
    ],
)
def test_a_malformed_claim_is_refused_alone_as_a_bad_field(changes: dict[str, Any]) -> None:
    frame = raw_frame([{**CLAIM, **changes}, {"id": 2, "cancel": "r.2"}])

    refused, cancel = decode_requests(frame)

    assert isinstance(refused, RefusedEntry)
    assert (refused.error.status, refused.error.code) == (400, "bad_field")
    assert isinstance(cancel, CancelEntry)


def test_a_cancel_keeping_a_malformed_chain_is_refused() -> None:
    (refused,) = decode_requests(raw_frame([{"id": 2, "cancel": "r.2", "keep": [1, 2]}]))

    assert isinstance(refused, RefusedEntry)
    assert refused.error.code == "bad_field"


PLAN = SignedPlan("r", "tiny", (PlanHop("a", "http://a", 0, 3),), prefix_scope="key:abc")


def test_a_plans_prefix_scope_travels_and_is_signed_only_when_set() -> None:
    assert SignedPlan.from_header(PLAN.to_header()) == PLAN
    assert PLAN.signed_fields()["prefix_scope"] == "key:abc"
    unscoped = SignedPlan("r", "tiny", PLAN.hops)
    assert "prefix_scope" not in unscoped.signed_fields()


@pytest.mark.parametrize("scope", [7, "x" * (PREFIX_MAX_SCOPE + 1)])
def test_a_malformed_prefix_scope_is_an_invalid_plan(scope: Any) -> None:
    data = {**PLAN.signed_fields(), "prefix_scope": scope}
    raw = base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    with pytest.raises(ProtocolError) as caught:
        SignedPlan.from_header(raw)

    assert caught.value.code == "invalid_plan"


def test_usage_reports_cached_tokens_only_when_some_were() -> None:
    usage = Usage(prompt_tokens=70, completion_tokens=5, cached_tokens=64)

    assert Usage.parse(usage.to_json()) == usage
    assert "cached_tokens" not in Usage(70, 5).to_json()
    with pytest.raises(ProtocolError):
        Usage.parse({"prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 4})
