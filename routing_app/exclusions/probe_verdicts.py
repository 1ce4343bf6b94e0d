"""The route-equivalence probe's verdicts (ADR-0007).

Every candidate route of a model answers the same fixed greedy probe, and
answers routes served clients are re-run on other routes (the tracker side
sends both: ``tracker_app.probes``; :func:`served_verdicts`). :func:`probe_verdicts`
compares each answer with a reference — the single full node when one
exists, else the answer most routes agree with — by :func:`probe_answers_compare`
(equal tokens, or a rounding near-tie where they first part: ADR-0015) and
names the nodes to blame for a difference. What follows from the verdicts
(quarantine, reputation, release) is ``routing_app.exclusions.quarantines``'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from nodes_app.protocol.logprobs import TokenLogprob
from routing_app.models import ProbeOutcome
from routing_app.planning.route_plan import RoutePlan

# Two answers that first part at position i still agree when each route's
# own gap there, from its chosen token down to the other route's, summed, is
# at most this (nats). The sum is how much the two routes disagree about the
# two tokens' logit difference, which is what rounding moves: at most 0.27
# nats over 400 positions of SmolLM2-135M with every layer in bfloat16, 0.17
# with a bfloat16 head before float32 layers, 0.07 in float16 (ADR-0015).
# Noise of the corrupt test's scale (5) never lands within it.
PROBE_TIE_MARGIN = 0.5


@dataclass(frozen=True)
class ProbeAnswer:
    """What one route generated for the probe: its token ids, or why it could not.

    ``logprobs`` holds the head's entry for each token id, in order, when it
    reported them (the probe asks for them); an answer without them can
    agree only token for token.
    """

    token_ids: tuple[int, ...] = ()
    error: str = ""
    elapsed_ms: float | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    # Some hop of the route computes below float32 (another dtype, or quantised
    # weights): its seeded draws need not repeat another route's (ADR-0015).
    rounded: bool = False

    @property
    def answered(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class ProbeComparison:
    """How two answers compare: ``first_difference`` is None when they are token-identical.

    ``tie_gap`` is the two routes' own gaps at the first difference, summed
    (None when a route did not list the other's token among its
    alternatives, or gave no logprobs there).
    """

    agree: bool
    first_difference: int | None = None
    tie_gap: float | None = None


def probe_answers_compare(
    a: ProbeAnswer, b: ProbeAnswer, *, margin: float = PROBE_TIE_MARGIN
) -> ProbeComparison:
    """Whether two answers agree: token for token, or parting first at a near-tie.

    At the first position where the tokens differ, each answer's gap is its
    chosen token's logprob minus the logprob it gave the other answer's token
    (found among its alternatives by written form and bytes; never below
    0, so one route cannot cancel the other's gap). The answers agree when
    both gaps are known and their sum is at most ``margin``. After that
    position the routes continue from different text, so nothing later is
    compared. Symmetric in ``a`` and ``b``. An answer that ends where the
    other goes on disagrees.

    A sampled answer (``margin`` infinite) parts wherever rounding moves the
    seeded draw's race between two tokens, near-tied or not, and in a flat
    distribution that may be at a token the other route did not list: there
    it agrees when a route rounds (``ProbeAnswer.rounded``), since only float32
    routes repeat each other's draws (ADR-0015).
    """
    if a.token_ids == b.token_ids:
        return ProbeComparison(agree=True)
    index = _first_difference(a.token_ids, b.token_ids)
    if index >= min(len(a.logprobs), len(b.logprobs)):
        return ProbeComparison(agree=False, first_difference=index)
    entry_a, entry_b = a.logprobs[index], b.logprobs[index]
    gap_a, gap_b = _gap(entry_a, entry_b), _gap(entry_b, entry_a)
    if gap_a is None or gap_b is None:
        unlisted = entry_a.logprob is not None and entry_b.logprob is not None
        sampled = math.isinf(margin)
        return ProbeComparison(unlisted and sampled and (a.rounded or b.rounded), index)
    tie_gap = gap_a + gap_b
    return ProbeComparison(tie_gap <= margin, index, tie_gap)


def _gap(own: TokenLogprob, other: TokenLogprob) -> float | None:
    """How far below its own choice ``own``'s route put ``other``'s token; None if unlisted."""
    if own.logprob is None:
        return None
    for alternative in own.top_logprobs:
        if (alternative.token, alternative.utf8) == (other.token, other.utf8):
            gap = own.logprob - alternative.logprob
            return max(gap, 0.0) if math.isfinite(gap) else None
    return None


@dataclass(frozen=True)
class Verdict:
    plan: RoutePlan
    answer: ProbeAnswer
    outcome: ProbeOutcome
    reference: RoutePlan | None = None
    first_difference: int | None = None
    suspects: tuple[str, ...] = ()
    tie_gap: float | None = None
    # Judged on a request a route served a client (its answer, or its re-run elsewhere).
    served: bool = False


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def probe_verdicts(
    answers: Sequence[tuple[RoutePlan, ProbeAnswer]], *, margin: float = PROBE_TIE_MARGIN
) -> list[Verdict]:
    """Each route's verdict, in the order given (best prior first).

    Answers are compared by :func:`probe_answers_compare`. An answer's
    support is the number of single-hop (full node) routes that agree with
    it, then the number of all routes that do; the reference is the route
    with the most (the one with fewest hops, then the first given, among
    those with the same support). When two routes with that support
    disagree with each other nothing is judged: every answered route is
    ``inconclusive``. A disagreeing route's suspects are its nodes that take
    part in no agreeing route. An agreeing route that parted from the
    reference at a near-tie keeps its ``first_difference`` and ``tie_gap``.
    """
    answered = [(plan, answer) for plan, answer in answers if answer.answered]
    reference = _reference(answered, margin)
    if reference is None:
        return [
            Verdict(
                plan, answer, ProbeOutcome.INCONCLUSIVE if answer.answered else ProbeOutcome.FAILED
            )
            for plan, answer in answers
        ]
    reference_plan, reference_answer = reference
    comparisons = [
        probe_answers_compare(answer, reference_answer, margin=margin) if answer.answered else None
        for _, answer in answers
    ]
    trusted = {
        node_id
        for (plan, _), comparison in zip(answers, comparisons, strict=True)
        if comparison is not None and comparison.agree
        for node_id in plan.node_ids
    }
    verdicts = []
    for (plan, answer), comparison in zip(answers, comparisons, strict=True):
        if comparison is None:
            verdicts.append(Verdict(plan, answer, ProbeOutcome.FAILED))
            continue
        if plan is reference_plan:
            outcome = ProbeOutcome.REFERENCE
        else:
            outcome = ProbeOutcome.AGREED if comparison.agree else ProbeOutcome.DISAGREED
        suspects = () if comparison.agree else tuple(n for n in plan.node_ids if n not in trusted)
        verdicts.append(
            Verdict(
                plan,
                answer,
                outcome,
                reference_plan,
                first_difference=comparison.first_difference,
                suspects=suspects,
                tie_gap=comparison.tie_gap,
            )
        )
    return verdicts


def _reference(
    answered: Sequence[tuple[RoutePlan, ProbeAnswer]], margin: float
) -> tuple[RoutePlan, ProbeAnswer] | None:
    """The reference route and its answer; None when none has the most support alone."""

    def agree(a: ProbeAnswer, b: ProbeAnswer) -> bool:
        return probe_answers_compare(a, b, margin=margin).agree

    def support(answer: ProbeAnswer) -> tuple[int, int]:
        agreeing = [plan for plan, other in answered if agree(answer, other)]
        return sum(len(plan.hops) == 1 for plan in agreeing), len(agreeing)

    if not answered:
        return None
    supports = [support(answer) for _, answer in answered]
    best = max(supports)
    contenders = [pair for pair, s in zip(answered, supports, strict=True) if s == best]
    if any(not agree(a, b) for (_, a) in contenders for (_, b) in contenders):
        return None  # two answers with equal support: no way to tell which is right
    return min(contenders, key=lambda pair: len(pair[0].hops))


# Routes a served answer is re-run on (besides, when they settle nothing, its own):
# a whole-model node, a route through each of its nodes, then the best others.
RERUN_ROUTES = 3


def rerun_routes(
    served: RoutePlan, candidates: Sequence[RoutePlan], *, limit: int = RERUN_ROUTES
) -> list[RoutePlan]:
    """The routes a served answer is re-run on, at most ``limit``, never ``served`` itself.

    First a single-hop route (a whole-model node: the strongest reference),
    then for each of the served route's nodes another route through it (an
    agreeing one clears that node, so the blame falls on the node that
    differs: a corrupt tail, not the head it shares with an honest route),
    then the best of the rest (``candidates`` are best prior first).
    """
    others = [plan for plan in candidates if plan.signature != served.signature]
    chosen: list[RoutePlan] = []

    def add(plan: RoutePlan) -> None:
        if plan not in chosen and len(chosen) < limit:
            chosen.append(plan)

    for plan in others:
        if len(plan.hops) == 1:
            add(plan)
            break
    for node_id in served.node_ids:
        for plan in others:
            if node_id in plan.node_ids and plan not in chosen:
                add(plan)
                break
    for plan in others:
        add(plan)
    return chosen


def self_rerun_needed(verdicts: Sequence[Verdict], *, margin: float = PROBE_TIE_MARGIN) -> bool:
    """Whether the served answer (``verdicts[0]``) needs its own route's re-run to be judged.

    When no other route agreed with it and none was found to disagree with a
    better-supported reference, the re-runs settled nothing (too few other
    routes, or a tie): the route must then at least answer the same
    deterministic request the same way twice.
    """
    served = verdicts[0]
    if served.outcome in (ProbeOutcome.DISAGREED, ProbeOutcome.FAILED):
        return False
    return not any(
        v.outcome in (ProbeOutcome.AGREED, ProbeOutcome.REFERENCE)
        and probe_answers_compare(v.answer, served.answer, margin=margin).agree
        for v in verdicts[1:]
    )


def served_verdicts(
    served: tuple[RoutePlan, ProbeAnswer],
    reruns: Sequence[tuple[RoutePlan, ProbeAnswer]],
    *,
    self_rerun: ProbeAnswer | None = None,
    margin: float = PROBE_TIE_MARGIN,
) -> list[Verdict]:
    """Verdicts on an answer a route served a client, re-run on other routes (``reruns``).

    The served answer and the re-runs are judged together by
    :func:`probe_verdicts`; the first verdict is the served route's, and
    every verdict is marked ``served`` (its tokens were a client's). Served
    requests are deterministic (greedy, or sampled with the seed the tracker
    keeps), so with ``self_rerun`` (the same request re-run on the served
    route) a route that answered it two ways disagrees: its suspects are its
    nodes that no other route vouches for (a route whose re-run agrees with
    ``self_rerun``). The served route's own re-run never vouches for its nodes.
    """
    verdicts = [
        replace(verdict, served=True)
        for verdict in probe_verdicts([served, *reruns], margin=margin)
    ]
    plan, answer = served
    if (
        self_rerun is None
        or not self_rerun.answered
        or verdicts[0].outcome
        in (
            ProbeOutcome.DISAGREED,
            ProbeOutcome.FAILED,
        )
    ):
        return verdicts
    comparison = probe_answers_compare(answer, self_rerun, margin=margin)
    if comparison.agree:
        return verdicts
    vouching = {
        node_id
        for other, rerun in reruns
        if rerun.answered and probe_answers_compare(rerun, self_rerun, margin=margin).agree
        for node_id in other.node_ids
    }
    verdicts[0] = Verdict(
        plan,
        answer,
        ProbeOutcome.DISAGREED,
        reference=plan,
        first_difference=comparison.first_difference,
        suspects=tuple(node_id for node_id in plan.node_ids if node_id not in vouching),
        tie_gap=comparison.tie_gap,
        served=True,
    )
    return verdicts
