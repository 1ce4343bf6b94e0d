"""A request's total deadline: nothing a head streams extends it."""

from __future__ import annotations

import uuid

import pytest

from tests.support.fake_heads import Behaviour, Net, record, served
from tracker_app.models import BillingRecord, RequestStatus

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_head_that_stops_mid_answer_is_cut_off_at_the_deadline_unbilled_and_banned(
    net: Net,
) -> None:
    net.node("stalls", 0, 3)
    net.heads.plan("stalls", Behaviour(tokens=2, then="hang"))
    proxy = net.proxy(settings={"request_deadline": 0.5})

    chunks, result = served(proxy)

    assert chunks[-1]["error"]["code"] == "request_deadline_exceeded"
    assert "stalls" in chunks[-1]["error"]["message"]
    assert result.error is not None
    assert record(proxy).status == RequestStatus.FAILED
    assert not BillingRecord.objects.filter(request_id=uuid.UUID(proxy.request_id)).exists()
    assert net.banned() == {"stalls"}


def test_a_choice_waiting_for_a_busy_routes_slot_at_the_deadline_blames_nobody(net: Net) -> None:
    net.node("full", 0, 3, sessions=1)  # honestly full: it reports its sessions
    net.heads.plan("full", Behaviour(status=503))
    proxy = net.proxy(settings={"request_deadline": 0.5, "busy_deadline": 60.0})

    chunks, _ = served(proxy)

    assert chunks[-1]["error"]["code"] == "request_deadline_exceeded"
    assert net.banned() == set()
