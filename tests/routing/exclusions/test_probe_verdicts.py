"""The probe's verdicts: which route agrees with the reference, and who is blamed (ADR-0007).

Answers are compared token for token, or up to a rounding near-tie where
they first part (ADR-0015).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing_app.exclusions.probe_verdicts import (
    PROBE_TIE_MARGIN,
    ProbeAnswer,
    probe_answers_compare,
    probe_verdicts,
    rerun_routes,
    self_rerun_needed,
    served_verdicts,
)
from tests.support.probe_answers import (
    CORRUPT,
    FLOAT32,
    FULL,
    MIXED,
    RIGHT,
    SPLIT,
    SURE,
    TOP,
    VIA_C,
    WRONG,
    answer,
    entry,
    plan,
    step,
)


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


# A flat position, as a tiny random model's: six tokens within 0.1 nats.
FLAT = {20 + n: -5.0 - n / 50 for n in range(TOP + 1)}


def flat_parting(*, sampled_from: int) -> tuple[ProbeAnswer, ProbeAnswer]:
    """A float32 answer and another that parts from it at a flat position, where its
    token (``sampled_from``) is not among the float32 route's five alternatives."""
    other = FLAT | {sampled_from: -4.98}
    return answer(SURE, FLAT, SURE), answer(SURE, other, SURE)


def test_a_greedy_answer_parting_at_an_unlisted_token_disagrees_even_where_a_route_rounds():
    float32, other = flat_parting(sampled_from=20 + TOP)

    comparison = probe_answers_compare(float32, replace(other, rounded=True))

    assert (comparison.agree, comparison.first_difference, comparison.tie_gap) == (False, 1, None)


def test_a_sampled_answer_parting_at_an_unlisted_token_agrees_only_where_a_route_rounds():
    float32, other = flat_parting(sampled_from=20 + TOP)
    rounded = replace(other, rounded=True)

    assert not probe_answers_compare(float32, other, margin=math.inf).agree
    assert probe_answers_compare(float32, rounded, margin=math.inf).agree
    assert probe_answers_compare(rounded, float32, margin=math.inf).agree


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


# --- answers routes served clients, re-run on other routes -----------------------------

HEAD_TAIL = plan(("h", 0, 1), ("bad", 2, 3))
HEAD_GOOD = plan(("h", 0, 1), ("good", 2, 3))
HEAD_FULL = plan(("h", 0, 1), ("full", 2, 3))


def test_a_served_answer_is_rerun_on_a_whole_node_then_through_each_of_its_nodes():
    other_head = plan(("h2", 0, 1), ("t2", 2, 3))

    chosen = rerun_routes(HEAD_TAIL, [other_head, HEAD_TAIL, HEAD_GOOD, FULL], limit=3)

    assert chosen == [FULL, HEAD_GOOD, other_head]


def test_the_tail_a_served_answer_differs_by_is_blamed_not_the_head_it_shares():
    verdicts = served_verdicts((HEAD_TAIL, WRONG), [(FULL, RIGHT), (HEAD_FULL, RIGHT)])

    assert outcomes(verdicts) == ["disagreed", "reference", "agreed"]
    assert verdicts[0].suspects == ("bad",)
    assert all(verdict.served for verdict in verdicts)


def test_a_route_answering_the_same_request_two_ways_disagrees_when_the_reruns_tie():
    # No whole node: the served answer and one other route tie; the served route's own
    # re-run (honest: it cannot tell) settles it, and the honest route clears the head.
    verdicts = served_verdicts((HEAD_TAIL, WRONG), [(HEAD_GOOD, RIGHT)])
    assert outcomes(verdicts)[0] == "inconclusive"
    assert self_rerun_needed(verdicts)

    settled = served_verdicts((HEAD_TAIL, WRONG), [(HEAD_GOOD, RIGHT)], self_rerun=RIGHT)

    assert outcomes(settled)[0] == "disagreed"
    assert settled[0].suspects == ("bad",)
    assert settled[0].first_difference == 2


def test_a_routes_own_rerun_never_vouches_for_it():
    settled = served_verdicts((HEAD_TAIL, WRONG), [], self_rerun=RIGHT)

    assert outcomes(settled)[0] == "disagreed"
    assert settled[0].suspects == ("h", "bad")


def test_a_served_answer_another_route_agrees_with_needs_no_rerun_of_its_own():
    verdicts = served_verdicts((HEAD_TAIL, RIGHT), [(HEAD_GOOD, RIGHT)])

    assert not self_rerun_needed(verdicts)
    assert outcomes(served_verdicts((HEAD_TAIL, RIGHT), [], self_rerun=RIGHT))[0] != "disagreed"
