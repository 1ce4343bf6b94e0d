"""Request records and billing: open a request, then complete or fail it exactly once.

A completed request gets one billing record with one work unit per hop, in
the same transaction as its completion. A failed or cancelled request gets
no charge. The status change is a conditional update, so a request can be
finished only once, whatever races with it.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction

from nodes_app.models import LanguageModel, Node
from tracker_app.billing.pricing import HopWork, invoice
from tracker_app.models import ApiKey, BillingRecord, ChatRequest, RequestStatus, WorkUnit


def chat_request_open(
    *,
    request_id: uuid.UUID,
    api_key: ApiKey,
    model: LanguageModel,
    stream: bool,
    now: datetime,
) -> ChatRequest:
    return ChatRequest.objects.create(
        id=request_id, api_key=api_key, model=model, stream=stream, started_at=now
    )


def chat_request_route(*, request_id: uuid.UUID, signature: str, mode: str) -> None:
    """Record the route serving the request (again after a failover)."""
    ChatRequest.objects.filter(pk=request_id).update(route_signature=signature, mode=mode)


def chat_request_complete(
    *,
    request_id: uuid.UUID,
    model: LanguageModel,
    prompt_tokens: int,
    completion_tokens: int,
    finish_reason: str,
    time_to_first_token_ms: float | None,
    tokens_per_second: float | None,
    work: list[HopWork],
    fee_share: Decimal,
    now: datetime,
) -> BillingRecord | None:
    """Mark the request completed and bill it at ``model``'s prices.

    None if it was already finished (failed, cancelled or billed before).
    """
    bill = invoice(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        prompt_price_per_1k=model.prompt_price_per_1k,
        completion_price_per_1k=model.completion_price_per_1k,
        fee_share=fee_share,
        work=work,
    )
    with transaction.atomic():
        finished = ChatRequest.objects.filter(
            pk=request_id, status=RequestStatus.PROCESSING
        ).update(
            status=RequestStatus.COMPLETED,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=finish_reason,
            time_to_first_token_ms=time_to_first_token_ms,
            tokens_per_second=tokens_per_second,
            finished_at=now,
        )
        if not finished:
            return None
        record = BillingRecord.objects.create(
            request_id=request_id,
            prompt_charge=bill.prompt_charge,
            completion_charge=bill.completion_charge,
            charge=bill.charge,
            network_fee=bill.network_fee,
        )
        nodes = Node.objects.in_bulk([share.work.node_id for share in bill.shares])
        WorkUnit.objects.bulk_create(
            WorkUnit(
                billing=record,
                node=nodes[share.work.node_id],
                start_layer=share.work.start_layer,
                end_layer=share.work.end_layer,
                tokens=share.work.tokens,
                units=share.work.units,
                amount=share.amount,
                route_signature=share.work.route_signature,
            )
            for share in bill.shares
        )
    return record


def chat_request_fail(
    *, request_id: uuid.UUID, error: str, now: datetime, cancelled: bool = False
) -> bool:
    """Mark the request failed (or cancelled by the client); never charged.

    True when this call finished it; False when it had finished already.
    """
    return (
        ChatRequest.objects.filter(pk=request_id, status=RequestStatus.PROCESSING).update(
            status=RequestStatus.CANCELLED if cancelled else RequestStatus.FAILED,
            error=error[:2000],
            finished_at=now,
        )
        > 0
    )


def chat_requests_fail_abandoned(*, now: datetime, older_than: timedelta) -> int:
    """Fail requests still processing long after any generation could last.

    A tracker killed mid-request leaves its rows processing; this closes them
    (uncharged) so the records and the Call wall tell the truth.
    """
    return ChatRequest.objects.filter(
        status=RequestStatus.PROCESSING, started_at__lt=now - older_than
    ).update(status=RequestStatus.FAILED, error="abandoned: the tracker stopped", finished_at=now)
