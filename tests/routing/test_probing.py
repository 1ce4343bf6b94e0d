"""The probe's verdicts and what follows: quarantine, reputation, back-off, release (ADR-0007)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from meshnet_site.outbox.models import OutboxMessage
from nodes_app.models import Node
from routing_app.models import ProbeOutcome, RouteProbe, RouteQuarantine
from routing_app.planner import Hop, RoutePlan
from routing_app.probing import (
    ROUTE_QUARANTINED,
    ROUTE_RELEASED,
    ProbeAnswer,
    probe_results_record,
    probe_verdicts,
    reprobe_delay,
)
from tests.support.routing import make_model, make_node

RIGHT = ProbeAnswer(token_ids=(5, 6, 7, 8))
WRONG = ProbeAnswer(token_ids=(5, 6, 9, 9))


def plan(*hops: tuple[str, int, int], model: str = "m") -> RoutePlan:
    return RoutePlan(model, 3, tuple(Hop(n, f"http://{n}", a, b) for n, a, b in hops))


FULL = plan(("full", 0, 3))
VIA_C = plan(("c", 0, 1), ("full", 2, 3))
SPLIT = plan(("h", 0, 1), ("t", 2, 3))


def outcomes(verdicts):
    return [str(v.outcome) for v in verdicts]


def test_a_route_unlike_the_full_node_disagrees_and_its_own_node_is_blamed():
    verdicts = probe_verdicts([(FULL, RIGHT), (VIA_C, WRONG)])

    assert outcomes(verdicts) == ["reference", "disagreed"]
    assert verdicts[1].suspects == ("c",)
    assert verdicts[1].first_difference == 2
    assert verdicts[1].reference is FULL


def test_the_full_node_is_the_reference_even_against_a_majority_of_split_routes():
    other = plan(("h2", 0, 1), ("t", 2, 3))

    verdicts = probe_verdicts([(SPLIT, WRONG), (other, WRONG), (FULL, RIGHT)])

    assert outcomes(verdicts) == ["disagreed", "disagreed", "reference"]
    assert verdicts[0].suspects == ("h", "t")


def test_without_a_full_node_the_majority_answer_is_the_reference():
    other = plan(("h2", 0, 1), ("t", 2, 3))
    third = plan(("h3", 0, 2), ("t3", 3, 3))

    verdicts = probe_verdicts([(SPLIT, RIGHT), (other, RIGHT), (third, WRONG)])

    assert outcomes(verdicts) == ["reference", "agreed", "disagreed"]
    assert verdicts[2].suspects == ("h3", "t3")


def test_a_tie_without_a_full_node_judges_nothing():
    other = plan(("h2", 0, 1), ("t2", 2, 3))

    assert outcomes(probe_verdicts([(SPLIT, RIGHT), (other, WRONG)])) == [
        "inconclusive",
        "inconclusive",
    ]


def test_a_route_that_failed_to_answer_is_not_judged():
    verdicts = probe_verdicts([(FULL, RIGHT), (VIA_C, ProbeAnswer(error="node c failed"))])

    assert outcomes(verdicts) == ["reference", "failed"]


def test_the_reprobe_backs_off_to_an_hour():
    assert [reprobe_delay(n).total_seconds() for n in (1, 2, 3, 10)] == [60, 120, 240, 3600]


@pytest.mark.django_db
class TestRecording:
    @pytest.fixture
    def network(self):
        model = make_model(num_layers=4)
        make_node(model, "full", 0, 3)
        make_node(model, "c", 0, 1)
        return (
            model,
            plan(("full", 0, 3), model=model.key),
            plan(("c", 0, 1), ("full", 2, 3), model=model.key),
        )

    def record(self, model, answers, now):
        return probe_results_record(
            model_key=model.key,
            epoch=1,
            verdicts=probe_verdicts(answers),
            now=now,
            lookback=timedelta(days=1),
        )

    def test_a_disagreeing_route_is_quarantined_its_node_penalised_and_the_dashboards_told(
        self, network
    ):
        model, full, via_c = network
        now = timezone.now()

        summary = self.record(model, [(full, RIGHT), (via_c, WRONG)], now)

        assert summary.quarantined == [via_c.signature]
        quarantine = RouteQuarantine.objects.get()
        assert (quarantine.signature, quarantine.suspects) == (via_c.signature, ["c"])
        assert quarantine.next_probe_at == now + timedelta(seconds=60)
        assert Node.objects.get(pk="c").reputation == 0.5
        assert Node.objects.get(pk="full").reputation == 1.0
        message = OutboxMessage.objects.get()
        assert (message.kind, message.payload["nodes"]) == (ROUTE_QUARANTINED, ["c"])
        assert sorted(RouteProbe.objects.values_list("outcome", flat=True)) == [
            ProbeOutcome.DISAGREED,
            ProbeOutcome.REFERENCE,
        ]

    def test_the_corrupt_window_starts_at_the_routes_last_agreeing_probe(self, network):
        model, full, via_c = network
        earlier = timezone.now() - timedelta(hours=2)
        self.record(model, [(full, RIGHT), (via_c, RIGHT)], earlier)

        self.record(model, [(full, RIGHT), (via_c, WRONG)], timezone.now())

        assert RouteQuarantine.objects.get().corrupt_since == earlier

    def test_a_route_disagreeing_again_waits_longer_and_is_penalised_once(self, network):
        model, full, via_c = network
        now = timezone.now()
        self.record(model, [(full, RIGHT), (via_c, WRONG)], now)

        summary = self.record(model, [(full, RIGHT), (via_c, WRONG)], now + timedelta(minutes=1))

        assert summary.quarantined == []
        quarantine = RouteQuarantine.objects.get()
        assert quarantine.strikes == 2
        assert quarantine.next_probe_at == now + timedelta(minutes=1) + timedelta(seconds=120)
        assert Node.objects.get(pk="c").reputation == 0.5

    def test_a_quarantined_route_that_agrees_again_is_released_and_its_node_restored(self, network):
        model, full, via_c = network
        now = timezone.now()
        self.record(model, [(full, RIGHT), (via_c, WRONG)], now)

        summary = self.record(model, [(full, RIGHT), (via_c, RIGHT)], now + timedelta(minutes=1))

        assert summary.released == [via_c.signature]
        assert RouteQuarantine.objects.get().released_at == now + timedelta(minutes=1)
        assert Node.objects.get(pk="c").reputation == 1.0
        last = OutboxMessage.objects.order_by("id").last()
        assert last is not None
        assert last.kind == ROUTE_RELEASED
