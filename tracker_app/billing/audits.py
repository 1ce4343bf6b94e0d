"""The billing audit (ADR-0007; ADR-0020's billing guard), run by ``billing.audit``.

One run looks at the requests started within the audit window and:

- flags completed multi-hop requests with fewer output tokens than the
  setting whose finish was not a natural stop (``AuditFlag``);
- refunds the whole charge of every request that had any work unit on a
  route while the probe had it, or later found it, corrupt: from its last
  agreeing probe to its release (``Refund``, reason ``corrupt_route``),
  including a request only partly served by it before or after a failover;
- refunds any failed request found charged (``charged_failure``; a cancelled
  request is billed for what its client was sent, a partly served one for the
  choices it was sent whole: ADR-0004);
- counts bills whose node payouts and network fee exceed the charge.

It records what it found in an ``AuditRun`` row. Running it again finds the
same things and changes nothing: a flag is unique per request and reason, a
refund per bill, so two audits racing over the same records refund once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from meshnet_site.celery import app as celery_app
from meshnet_site.outbox.services import outbox_put
from routing_app.models import RouteQuarantine
from tracker_app.models import (
    AuditFlag,
    AuditRun,
    AuditStatus,
    BillingRecord,
    ChatRequest,
    FlagReason,
    Refund,
    RefundReason,
    RequestStatus,
    WorkUnit,
)

logger = logging.getLogger(__name__)

AUDIT_TASK = "billing.audit"
REFUND = "refund"
# An AuditRun lists at most this many ids per finding; the counts are exact.
FINDINGS_LISTED = 100


def billing_audit(*, now: datetime, window: timedelta, short_completion_tokens: int) -> AuditRun:
    """Run one audit over the requests started since ``now - window``; its ``AuditRun``.

    Each flag and refund commits on its own, so a run that fails half-way
    keeps what it did (the run is marked failed and the error re-raised); the
    next run finds the rest.
    """
    run = AuditRun.objects.create(started_at=now, window_start=now - window)
    try:
        requests = ChatRequest.objects.filter(started_at__gte=run.window_start)
        run.requests_checked = requests.count()
        flagged = _flag_short_multi_hop(run, requests, short_completion_tokens)
        corrupt = _refund_corrupt_routes(run, now)
        failures = _refund_charged_failures(run, requests)
        violations = _payout_violations(requests)
        refunded = corrupt + failures
        run.flagged = len(flagged)
        run.refunds = len(refunded)
        run.refunded_amount = sum((refund.amount for refund in refunded), Decimal(0))
        run.charged_failures = len(failures)
        run.payout_violations = len(violations)
        run.findings = {
            "flagged_requests": [str(pk) for pk in flagged[:FINDINGS_LISTED]],
            "refunded_requests": [str(r.billing.request_id) for r in refunded[:FINDINGS_LISTED]],
            "charged_failures": [str(r.billing.request_id) for r in failures[:FINDINGS_LISTED]],
            "payout_violations": [str(pk) for pk in violations[:FINDINGS_LISTED]],
        }
        run.status = AuditStatus.COMPLETED
    except Exception as error:
        run.status = AuditStatus.FAILED
        run.error = f"{type(error).__name__}: {error}"[:2000]
        raise
    finally:
        run.finished_at = timezone.now()
        run.save()
    return run


def _flag_short_multi_hop(
    run: AuditRun, requests: QuerySet[ChatRequest], short: int
) -> list[uuid.UUID]:
    suspicious = (
        requests.filter(
            status=RequestStatus.COMPLETED,
            completion_tokens__lt=short,
            route_signature__contains=" -> ",
        )
        .exclude(finish_reason="stop")
        .exclude(flags__reason=FlagReason.SHORT_MULTI_HOP)
    )
    flagged: list[uuid.UUID] = []
    for request in suspicious:
        detail = (
            f"{request.completion_tokens} output token(s) over "
            f"{request.route_signature.count(' -> ') + 1} hops, "
            f"finish {request.finish_reason or 'unknown'!r}"
        )
        try:
            with transaction.atomic():
                AuditFlag.objects.create(
                    request=request,
                    reason=FlagReason.SHORT_MULTI_HOP,
                    detail=detail,
                    audit_run=run,
                )
        except IntegrityError:
            continue  # another audit flagged it first
        flagged.append(request.pk)
    return flagged


def _refund_corrupt_routes(run: AuditRun, now: datetime) -> list[Refund]:
    """Refund the bills of requests each quarantined route served while corrupt.

    A request counts if any of its work units is on the route (not its
    ``route_signature``, which is only the last route it failed over to) and
    it ran at some point in the corrupt span: started before the release and
    finished after ``corrupt_since``.
    """
    quarantines = RouteQuarantine.objects.filter(
        Q(released_at__isnull=True) | Q(released_at__gte=run.window_start)
    )
    refunds: list[Refund] = []
    for quarantine in quarantines:
        bills = (
            BillingRecord.objects.select_related("request")
            .filter(
                request__model__key=quarantine.model_key,
                request__started_at__lte=quarantine.released_at or now,
                request__finished_at__gte=quarantine.corrupt_since,
                refund__isnull=True,
            )
            .filter(
                pk__in=WorkUnit.objects.filter(route_signature=quarantine.signature).values(
                    "billing_id"
                )
            )
        )
        detail = (
            f"route quarantined at {quarantine.quarantined_at:%Y-%m-%d %H:%M:%S}: "
            f"{quarantine.reason}"
        )
        refunds += _refund_all(run, bills, RefundReason.CORRUPT_ROUTE, detail)
    return refunds


def _refund_charged_failures(run: AuditRun, requests: QuerySet[ChatRequest]) -> list[Refund]:
    bills = BillingRecord.objects.select_related("request").filter(
        request__in=requests,
        request__status=RequestStatus.FAILED,
        refund__isnull=True,
    )
    return _refund_all(run, bills, RefundReason.CHARGED_FAILURE, "the request did not complete")


def _refund_all(
    run: AuditRun, bills: Iterable[BillingRecord], reason: RefundReason, detail: str
) -> list[Refund]:
    refunds = []
    for bill in bills:
        try:
            with transaction.atomic():
                refund = Refund.objects.create(
                    billing=bill, amount=bill.charge, reason=reason, detail=detail, audit_run=run
                )
                outbox_put(
                    kind=REFUND,
                    subject=str(bill.request_id),
                    payload={
                        "request_id": str(bill.request_id),
                        "amount": str(bill.charge),
                        "reason": str(reason),
                        "audit_run": run.pk,
                    },
                )
        except IntegrityError:
            continue  # another audit refunded this bill first
        refunds.append(refund)
    return refunds


def _payout_violations(requests: QuerySet[ChatRequest]) -> list[uuid.UUID]:
    """Bills whose work-unit payouts plus the network fee exceed the charge."""
    bills = (
        BillingRecord.objects.filter(request__in=requests)
        .annotate(paid=Sum("work_units__amount"))
        .values_list("request_id", "charge", "network_fee", "paid")
    )
    return [
        request_id
        for request_id, charge, fee, paid in bills
        if Decimal(paid or 0) + Decimal(fee) > Decimal(charge)
    ]


def billing_audit_queue() -> None:
    """Queue a billing audit now (a route was just quarantined: refund its charges)."""
    try:
        celery_app.send_task(AUDIT_TASK, ignore_result=True)
    except Exception:  # the hourly audit will find it
        logger.warning("could not queue the billing audit", exc_info=True)
