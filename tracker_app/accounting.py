"""Request records and billing: open a request, then complete or fail it exactly once.

A completed request gets one billing record with one work unit per hop, in
the same transaction as its completion. A failed or cancelled request gets
no charge. The status change is a conditional update, so a request can be
finished only once, whatever races with it.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import transaction

from nodes_app.models import Node
from routing_app.models import LanguageModel
from tracker_app.billing import HopWork, invoice
from tracker_app.models import ApiKey, BillingRecord, ChatRequest, RequestStatus, WorkUnit


def chat_request_open(
    *, api_key: ApiKey, model: LanguageModel, stream: bool, now: datetime
) -> ChatRequest:
    return ChatRequest.objects.create(api_key=api_key, model=model, stream=stream, started_at=now)


def chat_request_route(*, request: ChatRequest, signature: str, mode: str) -> None:
    """Record the route serving the request (again after a failover)."""
    ChatRequest.objects.filter(pk=request.pk).update(route_signature=signature, mode=mode)


def chat_request_complete(
    *,
    request: ChatRequest,
    prompt_tokens: int,
    completion_tokens: int,
    finish_reason: str,
    time_to_first_token_ms: float | None,
    tokens_per_second: float | None,
    work: list[HopWork],
    fee_share: Decimal,
    now: datetime,
) -> BillingRecord | None:
    """Mark the request completed and bill it. None if it was already finished."""
    model = request.model
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
            pk=request.pk, status=RequestStatus.PROCESSING
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
            request=request,
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
            )
            for share in bill.shares
        )
    return record


def chat_request_fail(
    *, request: ChatRequest, error: str, now: datetime, cancelled: bool = False
) -> bool:
    """Mark the request failed (or cancelled by the client); never charged."""
    return (
        ChatRequest.objects.filter(pk=request.pk, status=RequestStatus.PROCESSING).update(
            status=RequestStatus.CANCELLED if cancelled else RequestStatus.FAILED,
            error=error[:2000],
            finished_at=now,
        )
        > 0
    )
