"""Route quarantines: what the probe's verdicts move (quarantine, reputation, back-off,
release) and what every tracker is told (ADR-0007)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from meshnet_site.outbox.models import OutboxMessage
from nodes_app.models import Node
from routing_app.exclusions.probe_verdicts import probe_verdicts, served_verdicts
from routing_app.exclusions.quarantines import (
    ROUTE_QUARANTINED,
    ROUTE_RELEASED,
    probe_results_record,
    quarantines_due,
    reprobe_delay,
)
from routing_app.models import ProbeOutcome, RouteProbe, RouteQuarantine
from tests.support.probe_answers import FLOAT32, MIXED, RIGHT, WRONG, plan
from tests.support.routing import make_model, make_node


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

    def test_a_route_parting_at_a_near_tie_is_recorded_agreeing_with_where_it_parted(self, network):
        model, full, via_c = network

        summary = self.record(model, [(full, FLOAT32), (via_c, MIXED)], timezone.now())

        assert summary.quarantined == []
        probe = RouteProbe.objects.get(signature=via_c.signature)
        assert (probe.outcome, probe.first_difference) == (ProbeOutcome.AGREED, 1)
        assert probe.tie_gap == pytest.approx(0.09)
        assert not RouteQuarantine.objects.exists()
        assert Node.objects.get(pk="c").reputation == 1.0

    def test_the_corrupt_window_spans_the_audit_window_whatever_probes_it_passed(self, network):
        # A node may answer probes honestly and clients not: a passed probe proves
        # nothing about what the route served, so every request the audit reads counts.
        model, full, via_c = network
        now = timezone.now()
        self.record(model, [(full, RIGHT), (via_c, RIGHT)], now - timedelta(minutes=5))

        self.record(model, [(full, RIGHT), (via_c, WRONG)], now)

        assert RouteQuarantine.objects.get().corrupt_since == now - timedelta(days=1)

    def test_a_route_whose_fault_no_evidence_pins_on_one_node_costs_nobody_reputation(
        self, network
    ):
        model, full, _ = network
        make_node(model, "h", 0, 1)
        make_node(model, "t", 2, 3)
        split = plan(("h", 0, 1), ("t", 2, 3), model=model.key)

        summary = self.record(model, [(full, RIGHT), (split, WRONG)], timezone.now())

        assert summary.quarantined == [split.signature]
        assert sorted(RouteQuarantine.objects.get().suspects) == ["h", "t"]
        assert Node.objects.get(pk="h").reputation == 1.0
        assert Node.objects.get(pk="t").reputation == 1.0

    def test_a_route_quarantined_on_a_served_request_keeps_no_tokens_and_is_never_released_by_it(
        self, network
    ):
        model, full, via_c = network
        now = timezone.now()
        self.record(model, [(full, RIGHT), (via_c, WRONG)], now)

        summary = probe_results_record(
            model_key=model.key,
            epoch=1,
            verdicts=served_verdicts((via_c, RIGHT), [(full, RIGHT)]),
            now=now + timedelta(minutes=1),
            lookback=timedelta(days=1),
        )

        assert summary.released == []
        assert RouteQuarantine.objects.get().released_at is None
        latest = RouteProbe.objects.filter(probed_at=now + timedelta(minutes=1))
        assert [probe.token_ids for probe in latest] == [[], []]

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

    def test_a_route_caught_on_what_it_served_is_neither_reprobed_nor_released_by_the_probe(
        self, network
    ):
        model, full, via_c = network
        now = timezone.now()
        probe_results_record(
            model_key=model.key,
            epoch=1,
            verdicts=served_verdicts((via_c, WRONG), [(full, RIGHT)]),
            now=now,
            lookback=timedelta(days=1),
        )
        later = now + timedelta(hours=2)

        assert quarantines_due(model_key=model.key, now=later) == set()
        summary = self.record(model, [(full, RIGHT), (via_c, RIGHT)], later)

        assert summary.released == []
        assert RouteQuarantine.objects.get().on_served
        assert Node.objects.get(pk="c").reputation == 0.5
