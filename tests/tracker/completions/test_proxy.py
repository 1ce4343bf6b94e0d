"""The completion proxy against fake heads: what the client streams, how it is routed.

A completed request streams every token then its usage; ``n`` choices stream
tagged by index; every send to a head carries a freshly signed plan, bounded
by the prompt, ``max_tokens`` and the request's own deadline. (A request
refused before anything streams is in ``test_admission.py``; how it is
recorded and billed at its end, in ``test_finishing.py``.) The heads are
faked at the HTTP boundary (:mod:`tests.support.fake_heads`); routing,
accounting and billing are real.
"""

from __future__ import annotations

import math
import time
from decimal import Decimal

import pytest
from django.conf import settings

from nodes_app.plans import IDLE_SILENCES, tracker_public_key
from nodes_app.shared.signing import public_key_from_hex, verify_plan
from tests.support.fake_heads import (
    Behaviour,
    Net,
    answer,
    record,
    serve,
    text,
    texts_by_choice,
    work,
)
from tracker_app.completions import console
from tracker_app.completions.head_stream import silence_limit
from tracker_app.completions.prompt_tokens import prompt_tokens_count
from tracker_app.models import BillingRecord, RequestStatus, WorkUnit

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_completed_request_streams_every_token_then_usage_and_bills_each_hop(
    net: Net,
) -> None:
    net.node("head", 0, 1)
    net.node("tail", 2, 3)
    proxy = net.proxy()

    chunks = serve(proxy)

    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["meshnet"]["route"] == f"{net.model.key} | head[0-1] -> tail[2-3]"
    assert text(chunks) == answer(12)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 12,
        "total_tokens": 19,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert all("meshnet_token_ids" not in chunk for chunk in chunks)
    request = record(proxy)
    assert (request.status, request.completion_tokens) == (RequestStatus.COMPLETED, 12)
    bill = BillingRecord.objects.get(request=request)
    # 7 prompt tokens at 0.01/1k and 12 completion tokens at 0.03/1k.
    assert bill.charge == Decimal("0.000070") + Decimal("0.000360")
    assert work(proxy) == [("head", 0, 1, 19), ("tail", 2, 3, 19)]
    kinds = net.event_kinds()
    assert kinds[:2] == [console.ROUTE_SELECTED, console.CONNECTED]
    # Progress is pushed off the relay: a head this fast finishes before any is due.
    assert set(kinds[2:-1]) <= {console.PROGRESS} and kinds[-1] == console.COMPLETE
    assert net.event_data(console.COMPLETE)["completion_tokens"] == 12
    assert net.heads.requests[0].resume_token_ids == []


def test_every_send_to_a_head_carries_a_fresh_plan_signed_by_the_tracker(net: Net) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=5, then="die"))
    began = time.time()

    serve(net.proxy())

    key = public_key_from_hex(tracker_public_key())
    first, second = net.heads.requests
    for request in (first, second):
        assert verify_plan(key, request.plan.signed_fields(), request.signature)
        assert began < request.expires_at <= time.time() + settings.MESHNET_PLAN_VALIDITY + 1
    assert first.signature != second.signature
    assert [r.hops[0].node_id for r in (first, second)] == ["fast", "slow"]


def test_each_send_lets_the_hops_hold_the_prompt_and_max_tokens_while_the_tracker_waits(
    net: Net,
) -> None:
    net.model.weight_source = "builtin:tiny-random-llama"  # the tracker counts the prompt
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=5, then="die"))
    began = time.time()

    serve(net.proxy(messages=[{"role": "user", "content": "hi"}], max_tokens=12))

    prompt = prompt_tokens_count(
        weight_source="builtin:tiny-random-llama",
        prompt=[{"role": "user", "content": "hi"}],
        max_tokens=12,
    ).tokens
    first, second = net.heads.requests
    assert len(second.resume_token_ids) == 5  # a failover replays: a fresh plan, fresh bounds
    for request in (first, second):
        resumed = len(request.resume_token_ids)
        silence = silence_limit(
            step_timeout=settings.MESHNET_HOP_STEP_TIMEOUT, hops=1, positions=prompt + resumed
        )
        # The resumed tokens are inside max_tokens: a replay is granted no more positions.
        assert request.max_positions == prompt + 12
        assert request.idle_seconds == math.ceil(IDLE_SILENCES * silence)
        lifetime = (1 + 12 - resumed) * silence
        assert began + lifetime <= request.ends_at <= time.time() + lifetime + 1


def test_no_send_lets_a_hop_hold_its_session_past_the_requests_own_deadline(net: Net) -> None:
    net.node("whole", 0, 3)
    began = time.time()

    serve(net.proxy(max_tokens=12, settings={"request_deadline": 5.0}))

    [request] = net.heads.requests
    assert request.ends_at <= math.ceil(began + 5.0) + 1  # not (1 + 12) step silences


def test_n_choices_stream_tagged_by_index_with_usage_summed_and_the_prompt_billed_once(
    net: Net,
) -> None:
    net.node("head", 0, 1)
    net.node("tail", 2, 3)
    proxy = net.proxy(n=3, seed=40, temperature=0.8)

    chunks = serve(proxy)

    assert texts_by_choice(chunks) == {0: answer(12), 1: answer(12), 2: answer(12)}
    openings = [c["choices"][0] for c in chunks if "role" in c["choices"][0]["delta"]]
    assert [o["index"] for o in openings] == [0, 1, 2]
    # The route opens the stream; the last event says it again, with speculation's figures.
    assert "meshnet" in chunks[0] and all("meshnet" not in c for c in chunks[1:-1])
    assert chunks[-1]["meshnet"]["route"] == chunks[0]["meshnet"]["route"]
    finishes = [c for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(c["choices"][0]["index"] for c in finishes) == [0, 1, 2]
    assert finishes[-1] is chunks[-1] and all("usage" not in c for c in finishes[:-1])
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 36,
        "total_tokens": 43,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    # One route, three generations on it, each its own seed.
    assert net.heads.heads_asked() == ["head"] * 3
    assert sorted(r.sampling.seed or 0 for r in net.heads.requests) == [40, 41, 42]
    bill = BillingRecord.objects.get(request=record(proxy))
    # The prompt once (7 at 0.01/1k), every choice's tokens (36 at 0.03/1k).
    assert bill.charge == Decimal("0.000070") + Decimal("0.001080")
    # Each hop ran its layers over the prompt and the tokens of every choice.
    assert work(proxy) == [("head", 0, 1, 3 * 19), ("tail", 2, 3, 3 * 19)]
    shares = sum((u.amount for u in WorkUnit.objects.filter(billing=bill)), Decimal(0))
    assert shares == bill.charge - bill.network_fee
    assert record(proxy).completion_tokens == 36
    assert net.event_data(console.COMPLETE)["completion_tokens"] == 36
