"""The probe's verdicts and what follows: quarantine, reputation, back-off, release (ADR-0007).

Answers are compared token for token, or up to a rounding near-tie where
they first part (ADR-0015).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from meshnet_site.outbox.models import OutboxMessage
from nodes_app.models import Node
from nodes_app.protocol.logprobs import TokenLogprob, TopLogprob
from routing_app.models import ProbeOutcome, RouteProbe, RouteQuarantine
from routing_app.planner import Hop, RoutePlan
from routing_app.probing import (
    PROBE_TIE_MARGIN,
    ROUTE_QUARANTINED,
    ROUTE_RELEASED,
    ProbeAnswer,
    probe_answers_compare,
    probe_results_record,
    probe_verdicts,
    reprobe_delay,
)
from tests.support.routing import make_model, make_node

RIGHT = ProbeAnswer(token_ids=(5, 6, 7, 8))
WRONG = ProbeAnswer(token_ids=(5, 6, 9, 9))
TOP = 5  # alternatives a head lists per token, as the probe asks


def spelled(token_id: int) -> tuple[str, tuple[int, ...]]:
    text = f"t{token_id}"
    return text, tuple(text.encode())


def step(scores: dict[int, float]) -> TokenLogprob:
    """A greedy head's entry for one position: its best token and its best alternatives."""
    best = sorted(scores, key=lambda token_id: (-scores[token_id], token_id))
    return entry(best[0], scores[best[0]], [(t, scores[t]) for t in best[:TOP]])


def entry(token_id: int, logprob: float, alternatives: list[tuple[int, float]]) -> TokenLogprob:
    token, utf8 = spelled(token_id)
    top = tuple(TopLogprob(*_written(t, lp)) for t, lp in alternatives)
    return TokenLogprob(token, logprob, utf8, top)


def _written(token_id: int, logprob: float) -> tuple[str, float, tuple[int, ...]]:
    token, utf8 = spelled(token_id)
    return token, logprob, utf8


def answer(*steps: dict[int, float]) -> ProbeAnswer:
    """A route's answer from the logprobs it saw at each position (greedy: the best is chosen)."""
    entries = tuple(step(scores) for scores in steps)
    return ProbeAnswer(token_ids=tuple(int(entry.token[1:]) for entry in entries), logprobs=entries)


SURE = {5: -0.01, 6: -5.0}
# float32 picks 7 by 0.05 nats; a bfloat16 head tips it to 8 by 0.04.
TIE_FLOAT32 = {7: -0.70, 8: -0.75, 9: -4.0}
TIE_BFLOAT16 = {7: -0.74, 8: -0.70, 9: -4.0}
FLOAT32 = answer(SURE, TIE_FLOAT32, {1: -0.1, 2: -3.0})
MIXED = answer(SURE, TIE_BFLOAT16, {3: -0.2, 1: -2.5})
# A corrupt hop: sure of a token the honest route put 3 nats down.
CORRUPT = answer(SURE, {9: -0.05, 7: -3.2, 8: -3.5}, {2: -0.3})


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


def test_routes_that_part_at_a_near_tie_agree_up_to_it():
    comparison = probe_answers_compare(FLOAT32, MIXED)

    assert comparison.agree
    assert comparison.first_difference == 1
    assert comparison.tie_gap == pytest.approx(0.05 + 0.04)


def test_a_route_that_parts_where_the_other_was_sure_disagrees():
    comparison = probe_answers_compare(FLOAT32, CORRUPT)

    assert not comparison.agree
    assert comparison.first_difference == 1
    assert comparison.tie_gap == pytest.approx(3.3 + 3.15)


def test_a_token_missing_from_the_other_routes_alternatives_is_a_disagreement():
    unlisted = answer(SURE, {10 + n: -0.5 - n / 100 for n in range(TOP)} | {7: -0.6})

    comparison = probe_answers_compare(FLOAT32, unlisted)

    assert (comparison.agree, comparison.tie_gap) == (False, None)


def test_answers_without_logprobs_agree_only_token_for_token():
    bare = ProbeAnswer(token_ids=MIXED.token_ids)

    assert not probe_answers_compare(FLOAT32, bare).agree
    assert probe_answers_compare(MIXED, bare).agree


def test_a_route_cannot_cancel_the_others_gap_by_claiming_it_preferred_the_other_token():
    honest = answer(SURE, {7: -0.4, 8: -1.0})
    # "Chose" 8 while listing 7 far above it: a gap of -0.49, counted as 0.
    liar = ProbeAnswer(
        token_ids=(5, 8), logprobs=(step(SURE), entry(8, -0.5, [(7, -0.01), (8, -0.5)]))
    )

    comparison = probe_answers_compare(honest, liar)

    assert not comparison.agree
    assert comparison.tie_gap == pytest.approx(0.6)


def test_an_answer_that_stops_where_the_other_goes_on_disagrees():
    short = answer(SURE)

    comparison = probe_answers_compare(FLOAT32, short)

    assert (comparison.agree, comparison.first_difference) == (False, 1)


# Properties of the rule over small vocabularies, where answers part often
# and near-ties are common.
VOCAB = list(range(6))
SCORES = st.dictionaries(st.sampled_from(VOCAB), st.floats(-1.5, 0.0), min_size=1)
STEPS = st.lists(SCORES, max_size=3)
# Above 0, so that each route's own choice is its best token without a tie.
GAPS = st.floats(1e-3, PROBE_TIE_MARGIN / 2)


@st.composite
def parting(draw: st.DrawFn, gap_a: float, gap_b: float) -> tuple[ProbeAnswer, ProbeAnswer]:
    """Two answers with a common prefix that part at one position with the given gaps."""
    prefix = draw(STEPS)
    x, y = draw(st.lists(st.sampled_from(VOCAB), min_size=2, max_size=2, unique=True))
    others = draw(
        st.dictionaries(st.sampled_from(VOCAB), st.floats(-8.0, -PROBE_TIE_MARGIN - 0.01))
    )
    others = {t: lp for t, lp in others.items() if t not in (x, y)}
    at_a = others | {x: 0.0, y: -gap_a}
    at_b = others | {y: 0.0, x: -gap_b}
    return (
        answer(*prefix, at_a, *draw(STEPS)),
        answer(*prefix, at_b, *draw(STEPS)),
    )


@st.composite
def pairs(draw: st.DrawFn) -> tuple[ProbeAnswer, ProbeAnswer]:
    prefix = draw(STEPS)
    return answer(*prefix, *draw(STEPS)), answer(*prefix, *draw(STEPS))


@settings(max_examples=300, deadline=None)
@given(pairs())
def test_the_comparison_is_symmetric(pair):
    a, b = pair

    assert probe_answers_compare(a, b) == probe_answers_compare(b, a)


@settings(max_examples=200, deadline=None)
@given(pairs())
def test_answers_with_the_same_tokens_agree_whatever_logprobs_they_report(pair):
    a, other = pair
    same_tokens = ProbeAnswer(token_ids=a.token_ids, logprobs=other.logprobs)

    assert probe_answers_compare(a, same_tokens).agree
    assert probe_answers_compare(a, ProbeAnswer(token_ids=a.token_ids)).agree


@settings(max_examples=200, deadline=None)
@given(st.data(), GAPS, GAPS)
def test_parting_at_a_near_tie_within_the_margin_is_agreement(data, gap_a, gap_b):
    a, b = data.draw(parting(gap_a, gap_b))

    comparison = probe_answers_compare(a, b)

    assert comparison.agree
    assert comparison.tie_gap == pytest.approx(gap_a + gap_b)


@settings(max_examples=200, deadline=None)
@given(st.data(), st.floats(PROBE_TIE_MARGIN + 1e-6, 20.0), st.floats(1e-3, 20.0))
def test_parting_where_one_route_was_clearly_surer_is_a_disagreement(data, clear, any_gap):
    a, b = data.draw(parting(clear, any_gap))

    assert not probe_answers_compare(a, b).agree
    assert not probe_answers_compare(b, a).agree


def test_a_mixed_precision_route_parting_at_a_near_tie_agrees_while_a_corrupt_one_does_not():
    mixed = plan(("bf16", 0, 1), ("full", 2, 3))

    verdicts = probe_verdicts([(FULL, FLOAT32), (mixed, MIXED), (VIA_C, CORRUPT)])

    assert outcomes(verdicts) == ["reference", "agreed", "disagreed"]
    assert (verdicts[1].first_difference, verdicts[1].suspects) == (1, ())
    assert verdicts[1].tie_gap == pytest.approx(0.09)
    assert verdicts[2].suspects == ("c",)


def test_without_a_full_node_routes_parting_at_a_near_tie_outvote_a_corrupt_one():
    mixed = plan(("bf16", 0, 1), ("t", 2, 3))
    corrupt = plan(("h3", 0, 2), ("t3", 3, 3))

    verdicts = probe_verdicts([(SPLIT, FLOAT32), (mixed, MIXED), (corrupt, CORRUPT)])

    assert outcomes(verdicts) == ["reference", "agreed", "disagreed"]
    assert verdicts[2].suspects == ("h3", "t3")


def test_two_routes_parting_where_both_were_sure_judge_nothing():
    other = plan(("h2", 0, 1), ("t2", 2, 3))

    verdicts = probe_verdicts([(SPLIT, FLOAT32), (other, CORRUPT)])

    assert outcomes(verdicts) == ["inconclusive", "inconclusive"]


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
