"""Request records and billing as the admin and the audits will read them."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from nodes_app.models import LanguageModel, Node
from tracker_app.api_keys.services import api_key_create
from tracker_app.billing.pricing import HopWork
from tracker_app.completions.recording import (
    CACHED_PROMPT_TOKENS,
    SPECULATED_TOKENS,
    chat_request_complete,
    chat_request_fail,
    chat_request_open,
    chat_requests_fail_abandoned,
)
from tracker_app.models import BillingRecord, ChatRequest, RequestStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def smol() -> LanguageModel:
    model = LanguageModel.objects.get(key="smollm2-135m")
    model.prompt_price_per_1k = Decimal("0.010000")
    model.completion_price_per_1k = Decimal("0.030000")
    model.save()
    for node_id, start, end in (("head", 0, 14), ("tail", 15, 29)):
        Node.objects.create(
            id=node_id,
            wallet="cd" * 32,
            endpoint=f"http://127.0.0.1/{node_id}",
            model=model,
            shard_start=start,
            shard_end=end,
            hardware="cpu",
            token_hash="x",
            registered_at=timezone.now(),
            last_heartbeat_at=timezone.now(),
        )
    return model


def open_request(model: LanguageModel) -> ChatRequest:
    key = api_key_create(name="client").api_key
    return chat_request_open(
        request_id=uuid.uuid4(), api_key=key, model=model, stream=True, now=timezone.now()
    )


def complete(request: ChatRequest) -> BillingRecord | None:
    return chat_request_complete(
        request_id=request.pk,
        model=request.model,
        prompt_tokens=120,
        completion_tokens=40,
        finish_reason="stop",
        time_to_first_token_ms=80.0,
        tokens_per_second=15.5,
        work=[HopWork("head", 0, 14, 160), HopWork("tail", 15, 29, 160)],
        fee_share=Decimal("0.05"),
        now=timezone.now(),
    )


def test_a_completed_request_is_billed_to_the_cent_with_one_work_unit_per_hop(
    smol: LanguageModel,
) -> None:
    request = open_request(smol)

    record = complete(request)

    assert record is not None
    request.refresh_from_db()
    assert request.status == RequestStatus.COMPLETED
    assert (request.prompt_tokens, request.completion_tokens) == (120, 40)
    assert record.charge == Decimal("0.002400")  # 0.12 × 0.01 + 0.04 × 0.03
    assert record.network_fee == Decimal("0.000120")
    units = list(record.work_units.order_by("start_layer"))
    assert [(u.node_id, u.units, u.amount) for u in units] == [
        ("head", 2400, Decimal("0.001140")),
        ("tail", 2400, Decimal("0.001140")),
    ]


def test_a_request_is_billed_only_once(smol: LanguageModel) -> None:
    request = open_request(smol)
    complete(request)

    assert complete(request) is None
    assert BillingRecord.objects.count() == 1


def test_a_failed_request_is_not_charged_and_cannot_be_completed_later(
    smol: LanguageModel,
) -> None:
    request = open_request(smol)

    assert chat_request_fail(request_id=request.pk, error="hop died", now=timezone.now())
    assert not chat_request_fail(request_id=request.pk, error="again", now=timezone.now())

    assert complete(request) is None
    request.refresh_from_db()
    assert request.status == RequestStatus.FAILED and request.error == "hop died"
    assert not BillingRecord.objects.exists()


def test_requests_abandoned_by_a_stopped_tracker_are_failed_uncharged(
    smol: LanguageModel,
) -> None:
    old, fresh = open_request(smol), open_request(smol)
    ChatRequest.objects.filter(pk=old.pk).update(started_at=timezone.now() - timedelta(hours=4))

    closed = chat_requests_fail_abandoned(now=timezone.now(), older_than=timedelta(hours=3))

    assert closed == 1
    old.refresh_from_db()
    fresh.refresh_from_db()
    assert (old.status, fresh.status) == (RequestStatus.FAILED, RequestStatus.PROCESSING)
    assert "abandoned" in old.error
    assert complete(old) is None


def test_cached_prompt_tokens_are_recorded_billed_at_the_cached_price_and_counted(
    smol: LanguageModel,
) -> None:
    smol.cached_prompt_price_per_1k = Decimal("0.001000")
    smol.save()
    request = open_request(smol)
    counted = CACHED_PROMPT_TOKENS.labels(model=smol.key)._value.get()

    record = chat_request_complete(
        request_id=request.pk,
        model=request.model,
        prompt_tokens=120,
        completion_tokens=40,
        cached_tokens=96,
        finish_reason="stop",
        time_to_first_token_ms=80.0,
        tokens_per_second=15.5,
        work=[HopWork("head", 0, 14, 64), HopWork("tail", 15, 29, 64)],
        fee_share=Decimal("0.05"),
        now=timezone.now(),
    )

    assert record is not None
    request.refresh_from_db()
    assert (request.prompt_tokens, request.cached_tokens) == (120, 96)
    # 24 × 0.010 / 1000 + 96 × 0.001 / 1000 = 0.000240 + 0.000096
    assert record.prompt_charge == Decimal("0.000336")
    assert record.charge == Decimal("0.000336") + Decimal("0.001200")
    assert CACHED_PROMPT_TOKENS.labels(model=smol.key)._value.get() == counted + 96


def test_speculations_drafts_are_counted_not_billed(smol: LanguageModel) -> None:
    request = open_request(smol)
    plain = chat_request_complete(
        request_id=open_request(smol).pk,
        model=smol,
        prompt_tokens=120,
        completion_tokens=40,
        finish_reason="stop",
        time_to_first_token_ms=80.0,
        tokens_per_second=15.5,
        work=[HopWork("head", 0, 14, 160), HopWork("tail", 15, 29, 160)],
        fee_share=Decimal("0.05"),
        now=timezone.now(),
    )
    drafted = SPECULATED_TOKENS.labels(model=smol.key, kind="drafted")._value.get()
    accepted = SPECULATED_TOKENS.labels(model=smol.key, kind="accepted")._value.get()

    record = chat_request_complete(
        request_id=request.pk,
        model=request.model,
        prompt_tokens=120,
        completion_tokens=40,
        drafted_tokens=30,
        accepted_tokens=24,
        finish_reason="stop",
        time_to_first_token_ms=80.0,
        tokens_per_second=15.5,
        work=[HopWork("head", 0, 14, 160), HopWork("tail", 15, 29, 160)],
        fee_share=Decimal("0.05"),
        now=timezone.now(),
    )

    assert record is not None and plain is not None
    assert record.charge == plain.charge
    assert SPECULATED_TOKENS.labels(model=smol.key, kind="drafted")._value.get() == drafted + 30
    assert SPECULATED_TOKENS.labels(model=smol.key, kind="accepted")._value.get() == accepted + 24
