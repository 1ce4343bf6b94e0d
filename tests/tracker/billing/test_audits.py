"""The billing audit: flags, refunds of corrupt routes' charges, checks, idempotence."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from meshnet_site.outbox.models import OutboxMessage
from nodes_app.models import LanguageModel
from routing_app.models import RouteQuarantine
from tests.support.routing import make_model, make_node
from tracker_app import tasks
from tracker_app.api_keys.services import api_key_create
from tracker_app.billing.audits import REFUND, billing_audit
from tracker_app.billing.pricing import HopWork
from tracker_app.completions.recording import (
    chat_request_complete,
    chat_request_open,
    chat_request_route,
)
from tracker_app.models import (
    AuditFlag,
    AuditStatus,
    BillingRecord,
    ChatRequest,
    FlagReason,
    Refund,
    RefundReason,
    RequestStatus,
    WorkUnit,
)

pytestmark = pytest.mark.django_db

WINDOW = timedelta(days=1)


@pytest.fixture
def model() -> LanguageModel:
    model = make_model(num_layers=4)
    model.prompt_price_per_1k = Decimal("0.010000")
    model.completion_price_per_1k = Decimal("0.030000")
    model.save()
    for node_id, start, end in (("h", 0, 1), ("t", 2, 3), ("full", 0, 3)):
        make_node(model, node_id, start, end)
    return model


SPLIT = "{model} | h[0-1] -> t[2-3]"
FULL = "{model} | full[0-3]"


def served(
    model: LanguageModel,
    *,
    signature: str = SPLIT,
    completion_tokens: int = 40,
    finish_reason: str = "stop",
    at: datetime | None = None,
    finished: datetime | None = None,
    failed_over_from: Sequence[str] = (),
) -> ChatRequest:
    """A completed, billed request served by ``signature``, after failing over
    from the routes ``failed_over_from`` (each of which produced tokens)."""
    at = at or timezone.now()
    key = api_key_create(name="client").api_key
    request = chat_request_open(
        request_id=uuid.uuid4(), api_key=key, model=model, stream=False, now=at
    )
    work = []
    for route in [*failed_over_from, signature]:
        route = route.format(model=model.key)
        chat_request_route(request_id=request.pk, signature=route, mode="exploit")
        hops = [part.split("[")[0] for part in route.split(" | ")[1].split(" -> ")]
        work += [
            HopWork(node_id=node, start_layer=0, end_layer=1, tokens=50, route_signature=route)
            for node in hops
        ]
    chat_request_complete(
        request_id=request.pk,
        model=model,
        prompt_tokens=10,
        completion_tokens=completion_tokens,
        finish_reason=finish_reason,
        time_to_first_token_ms=None,
        tokens_per_second=None,
        work=work,
        fee_share=Decimal("0.05"),
        now=finished or at,
    )
    return request


def quarantine(model: LanguageModel, since: datetime, at: datetime) -> RouteQuarantine:
    return RouteQuarantine.objects.create(
        model_key=model.key,
        signature=SPLIT.format(model=model.key),
        suspects=["t"],
        reason="token 2 differs",
        corrupt_since=since,
        quarantined_at=at,
        next_probe_at=at,
    )


def audit(now: datetime | None = None):
    return billing_audit(now=now or timezone.now(), window=WINDOW, short_completion_tokens=4)


def test_it_flags_short_multi_hop_completions_that_did_not_stop_naturally(model):
    suspicious = served(model, completion_tokens=2, finish_reason="length")
    served(model, completion_tokens=2, finish_reason="stop")  # a natural short answer
    served(model, signature=FULL, completion_tokens=2, finish_reason="length")  # one hop
    served(model, completion_tokens=40, finish_reason="length")

    run = audit()

    assert run.flagged == 1
    flag = AuditFlag.objects.get()
    assert (flag.request_id, flag.reason, flag.audit_run) == (
        suspicious.pk,
        FlagReason.SHORT_MULTI_HOP,
        run,
    )


def test_it_refunds_the_charges_of_a_corrupt_route_since_it_was_last_known_good(model):
    now = timezone.now()
    before = served(model, at=now - timedelta(hours=3))
    during = [served(model, at=now - timedelta(minutes=m)) for m in (50, 20)]
    elsewhere = served(model, signature=FULL, at=now - timedelta(minutes=30))
    quarantine(model, since=now - timedelta(hours=1), at=now - timedelta(minutes=5))

    run = audit(now)

    refunded = set(Refund.objects.values_list("billing__request_id", flat=True))
    assert refunded == {request.pk for request in during}
    assert before.pk not in refunded and elsewhere.pk not in refunded
    refund = Refund.objects.first()
    assert refund is not None
    assert refund.reason == RefundReason.CORRUPT_ROUTE and refund.audit_run == run
    assert refund.amount == refund.billing.charge
    assert run.refunded_amount == sum(r.amount for r in Refund.objects.all())
    assert isinstance(run.refunded_amount, Decimal)
    assert OutboxMessage.objects.filter(kind=REFUND).count() == 2


def test_a_request_that_failed_over_away_from_a_corrupt_route_is_refunded_in_full(model):
    now = timezone.now()
    request = served(
        model, signature=FULL, failed_over_from=[SPLIT], at=now - timedelta(minutes=20)
    )
    good_failover = served(
        model, signature=FULL, failed_over_from=[FULL], at=now - timedelta(minutes=20)
    )
    quarantine(model, since=now - timedelta(hours=1), at=now - timedelta(minutes=5))

    run = audit(now)

    refund = Refund.objects.get()
    assert refund.billing.request_id == request.pk
    assert refund.amount == refund.billing.charge
    assert refund.reason == RefundReason.CORRUPT_ROUTE
    assert run.findings["refunded_requests"] == [str(request.pk)]
    assert not Refund.objects.filter(billing__request=good_failover).exists()


def test_a_request_that_failed_over_onto_a_corrupt_route_is_refunded_in_full(model):
    now = timezone.now()
    request = served(
        model, signature=SPLIT, failed_over_from=[FULL], at=now - timedelta(minutes=20)
    )
    quarantine(model, since=now - timedelta(hours=1), at=now - timedelta(minutes=5))

    audit(now)

    refund = Refund.objects.get()
    assert refund.billing.request_id == request.pk
    assert refund.amount == refund.billing.charge


def test_a_request_started_before_the_corruption_but_finished_during_it_is_refunded(model):
    now = timezone.now()
    request = served(
        model,
        signature=SPLIT,
        failed_over_from=[FULL],
        at=now - timedelta(minutes=70),
        finished=now - timedelta(minutes=50),
    )
    quarantine(model, since=now - timedelta(hours=1), at=now - timedelta(minutes=5))

    audit(now)

    assert Refund.objects.get().billing.request_id == request.pk


def test_a_second_audit_changes_nothing(model):
    now = timezone.now()
    served(model, at=now - timedelta(minutes=10))
    served(model, completion_tokens=1, finish_reason="length")
    quarantine(model, since=now - timedelta(hours=1), at=now)

    first, second = audit(now), audit(now)

    assert (first.refunds, first.flagged) == (1, 1)
    assert (second.refunds, second.flagged, second.refunded_amount) == (0, 0, Decimal(0))
    assert Refund.objects.count() == 1 and AuditFlag.objects.count() == 1


def test_it_refunds_a_failed_request_found_charged(model):
    request = served(model)
    ChatRequest.objects.filter(pk=request.pk).update(status=RequestStatus.FAILED)

    run = audit()

    assert run.charged_failures == 1
    assert Refund.objects.get().reason == RefundReason.CHARGED_FAILURE


@pytest.mark.parametrize("status", [RequestStatus.CANCELLED, RequestStatus.PARTIAL])
def test_it_keeps_the_bill_of_a_request_whose_client_was_sent_part_of_its_answer(model, status):
    request = served(model)
    ChatRequest.objects.filter(pk=request.pk).update(status=status)

    run = audit()

    assert run.charged_failures == 0
    assert not Refund.objects.exists()


def test_it_counts_bills_whose_payouts_exceed_the_charge(model):
    request = served(model)
    served(model)
    WorkUnit.objects.filter(billing__request=request).update(amount=Decimal("1.000000"))

    run = audit()

    assert run.payout_violations == 1
    assert run.findings["payout_violations"] == [str(request.pk)]
    assert run.status == AuditStatus.COMPLETED


def test_it_leaves_requests_outside_the_window_alone(model):
    old = served(model, completion_tokens=1, finish_reason="length", at=timezone.now() - 2 * WINDOW)

    run = audit()

    assert run.requests_checked == 0
    assert not AuditFlag.objects.filter(request=old).exists()


def test_the_audit_task_reports_its_run(model, settings):
    settings.MESHNET_AUDIT_SHORT_COMPLETION_TOKENS = 100
    served(model, finish_reason="length")

    result = tasks.audit_billing()

    assert result["flagged"] == 1
    assert result["refunded_amount"] == "0"
    assert BillingRecord.objects.count() == 1
