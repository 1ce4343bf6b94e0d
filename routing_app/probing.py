"""The route-equivalence probe's verdicts and what follows from them (ADR-0007).

Every candidate route of a model answers the same fixed greedy probe (the
tracker side sends it: ``tracker_app.probes``). :func:`probe_verdicts`
compares each answer with a reference — the single full node when one
exists, else the answer most routes agree with — by :func:`probe_answers_compare`
(equal tokens, or a rounding near-tie where they first part: ADR-0015) and
names the nodes to blame for a difference. :func:`probe_results_record` writes the
``RouteProbe`` rows and moves quarantines: a disagreeing route is
quarantined (trackers take it out of the choice at their next sync), its
suspect nodes lose reputation and the dashboards are told; a quarantined
route is re-probed with back-off and released when it agrees again.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Least

from meshnet_site.outbox.services import outbox_put
from nodes_app.models import Node
from nodes_app.protocol.logprobs import TokenLogprob
from routing_app.models import ProbeOutcome, RouteProbe, RouteQuarantine
from routing_app.planner import RoutePlan

# Re-probe a quarantined route after 60 s, 120 s, 240 s… at most hourly.
REPROBE_BASE = timedelta(seconds=60)
REPROBE_MAX = timedelta(hours=1)
# A suspect node's reputation is multiplied by this when its route is
# quarantined, and divided by it (up to 1) when the route is released.
REPUTATION_PENALTY = 0.5
# Two answers that first part at position i still agree when each route's
# own gap there, from its chosen token down to the other route's, summed, is
# at most this (nats). The sum is how much the two routes disagree about the
# two tokens' logit difference, which is what rounding moves: at most 0.27
# nats over 400 positions of SmolLM2-135M with every layer in bfloat16, 0.17
# with a bfloat16 head before float32 layers, 0.07 in float16 (ADR-0015).
# Noise of the corrupt test's scale (5) never lands within it.
PROBE_TIE_MARGIN = 0.5

ROUTE_QUARANTINED = "route quarantined"
ROUTE_RELEASED = "route released"


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
    """
    if a.token_ids == b.token_ids:
        return ProbeComparison(agree=True)
    index = _first_difference(a.token_ids, b.token_ids)
    if index >= min(len(a.logprobs), len(b.logprobs)):
        return ProbeComparison(agree=False, first_difference=index)
    entry_a, entry_b = a.logprobs[index], b.logprobs[index]
    gap_a, gap_b = _gap(entry_a, entry_b), _gap(entry_b, entry_a)
    if gap_a is None or gap_b is None:
        return ProbeComparison(agree=False, first_difference=index)
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


@dataclass
class ProbeRunSummary:
    """What one probe run of one model found."""

    model_key: str
    epoch: int
    run_id: uuid.UUID
    outcomes: dict[str, str] = field(default_factory=dict)  # signature -> outcome
    quarantined: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model_key,
            "epoch": self.epoch,
            "run_id": str(self.run_id),
            "outcomes": self.outcomes,
            "quarantined": self.quarantined,
            "released": self.released,
        }


def reprobe_delay(strikes: int) -> timedelta:
    """How long a route quarantined ``strikes`` probes in a row waits for its next probe."""
    return min(REPROBE_MAX, REPROBE_BASE * 2 ** max(strikes - 1, 0))


def probe_results_record(
    *,
    model_key: str,
    epoch: int,
    verdicts: Sequence[Verdict],
    now: datetime,
    lookback: timedelta,
    on_quarantine: Callable[[], None] | None = None,
) -> ProbeRunSummary:
    """Write one run's ``RouteProbe`` rows and apply its verdicts to the quarantines.

    ``lookback`` bounds ``corrupt_since`` for a route never seen agreeing.
    ``on_quarantine`` runs once after the commit when a route was newly
    quarantined (the billing audit is queued there).
    """
    summary = ProbeRunSummary(model_key=model_key, epoch=epoch, run_id=uuid.uuid4())
    for verdict in verdicts:
        signature = verdict.plan.signature
        summary.outcomes[signature] = str(verdict.outcome)
        RouteProbe.objects.create(
            run_id=summary.run_id,
            model_key=model_key,
            epoch=epoch,
            signature=signature,
            hops=verdict.plan.to_dict(),
            outcome=verdict.outcome,
            token_ids=list(verdict.answer.token_ids),
            reference_signature=verdict.reference.signature if verdict.reference else "",
            first_difference=verdict.first_difference,
            tie_gap=verdict.tie_gap,
            suspects=list(verdict.suspects),
            error=verdict.answer.error[:2000],
            elapsed_ms=verdict.answer.elapsed_ms,
            probed_at=now,
        )
        if verdict.outcome is ProbeOutcome.DISAGREED:
            if _quarantine(verdict, model_key, now, lookback):
                summary.quarantined.append(signature)
        elif verdict.outcome in (ProbeOutcome.AGREED, ProbeOutcome.REFERENCE) and _release(
            verdict, model_key, now
        ):
            summary.released.append(signature)
    if summary.quarantined and on_quarantine is not None:
        transaction.on_commit(on_quarantine)
    return summary


def _active_quarantine_locked(model_key: str, signature: str) -> RouteQuarantine | None:
    """The route's unreleased quarantine, row-locked until the transaction ends."""
    return (
        RouteQuarantine.objects.select_for_update()
        .filter(model_key=model_key, signature=signature, released_at__isnull=True)
        .first()
    )


def _quarantine(verdict: Verdict, model_key: str, now: datetime, lookback: timedelta) -> bool:
    """Quarantine the route, or count one more strike; True when it is newly quarantined."""
    signature = verdict.plan.signature
    with transaction.atomic():
        active = _active_quarantine_locked(model_key, signature)
        if active is not None:
            active.strikes += 1
            active.next_probe_at = now + reprobe_delay(active.strikes)
            active.save(update_fields=["strikes", "next_probe_at"])
            return False
        last_good = (
            RouteProbe.objects.filter(
                model_key=model_key,
                signature=signature,
                outcome__in=[ProbeOutcome.AGREED, ProbeOutcome.REFERENCE],
                probed_at__lt=now,
            )
            .order_by("-probed_at")
            .values_list("probed_at", flat=True)
            .first()
        )
        reason = (
            f"token {verdict.first_difference} of the probe differs from "
            f"{verdict.reference.signature if verdict.reference else 'the reference'}"
        )
        try:
            with transaction.atomic():
                RouteQuarantine.objects.create(
                    model_key=model_key,
                    signature=signature,
                    suspects=list(verdict.suspects),
                    reason=reason,
                    corrupt_since=max(last_good or now - lookback, now - lookback),
                    quarantined_at=now,
                    next_probe_at=now + reprobe_delay(1),
                )
        except IntegrityError:
            return False  # a probe running at the same time quarantined it first
        Node.objects.filter(pk__in=verdict.suspects).update(
            reputation=F("reputation") * REPUTATION_PENALTY
        )
        outbox_put(
            kind=ROUTE_QUARANTINED,
            subject=signature,
            payload={
                "model": model_key,
                "signature": signature,
                "nodes": list(verdict.suspects),
                "reason": reason,
            },
        )
    return True


def _release(verdict: Verdict, model_key: str, now: datetime) -> bool:
    """Release the route's active quarantine, if any; True when one was released."""
    signature = verdict.plan.signature
    with transaction.atomic():
        active = _active_quarantine_locked(model_key, signature)
        if active is None:
            return False
        active.released_at = now
        active.save(update_fields=["released_at"])
        Node.objects.filter(pk__in=active.suspects).update(
            reputation=Least(F("reputation") / REPUTATION_PENALTY, 1.0)
        )
        outbox_put(
            kind=ROUTE_RELEASED,
            subject=signature,
            payload={"model": model_key, "signature": signature, "nodes": active.suspects},
        )
    return True


def quarantines_due(*, model_key: str, now: datetime) -> set[str]:
    """Signatures of the model's quarantined routes whose next probe is due."""
    return set(
        RouteQuarantine.objects.filter(
            model_key=model_key, released_at__isnull=True, next_probe_at__lte=now
        ).values_list("signature", flat=True)
    )


def quarantines_held(*, model_key: str) -> set[str]:
    """Signatures of the model's routes under quarantine now."""
    return set(
        RouteQuarantine.objects.filter(model_key=model_key, released_at__isnull=True).values_list(
            "signature", flat=True
        )
    )


def models_with_quarantines_due(*, now: datetime) -> list[str]:
    """Keys of the models with a quarantined route due for its re-probe."""
    return sorted(
        set(
            RouteQuarantine.objects.filter(
                released_at__isnull=True, next_probe_at__lte=now
            ).values_list("model_key", flat=True)
        )
    )
