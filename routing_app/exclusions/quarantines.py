"""Route quarantines: what follows from the probe's verdicts (ADR-0007).

A route is quarantined (kept out of the choice, see ``routing_app.exclusions.kept_out``)
when its answer to the probe, or an answer it served a client, disagreed with
the reference (``routing_app.exclusions.probe_verdicts``), or when its head ran past a client's
stop sequence or budget (``tracker_app.served_answers``), until a later probe
agrees. :func:`probe_results_record`
writes a run's ``RouteProbe`` rows and moves the ``RouteQuarantine`` rows: a
disagreeing route is quarantined (trackers take it out of the choice at their
next sync), its suspect node loses reputation when the evidence names one, and
the dashboards are told; a
quarantined route is re-probed with back-off and released when it agrees again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Least

from meshnet_site.outbox.services import outbox_put
from nodes_app.models import Node
from routing_app.exclusions.probe_verdicts import Verdict
from routing_app.learning.arms import ArmKey
from routing_app.models import ProbeOutcome, RouteProbe, RouteQuarantine

# Re-probe a quarantined route after 60 s, 120 s, 240 s… at most hourly.
REPROBE_BASE = timedelta(seconds=60)
REPROBE_MAX = timedelta(hours=1)
# A suspect node's reputation is multiplied by this when its route is
# quarantined, and divided by it (up to 1) when the route is released.
REPUTATION_PENALTY = 0.5

ROUTE_QUARANTINED = "route quarantined"
ROUTE_RELEASED = "route released"


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

    ``lookback`` is how far back ``corrupt_since`` lies (:func:`route_quarantine`).
    ``on_quarantine`` runs once after the commit when a route was newly
    quarantined (the billing audit is queued there). A verdict on a served
    request (``Verdict.served``) keeps no token ids (they were a client's
    request's) and releases nothing: a route a node cheats on answers some
    requests honestly.
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
            token_ids=[] if verdict.served else list(verdict.answer.token_ids),
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
        elif (
            verdict.outcome in (ProbeOutcome.AGREED, ProbeOutcome.REFERENCE)
            and not verdict.served
            and _release(verdict, model_key, now)
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
    """Quarantine the verdict's route, or count one more strike; True when newly quarantined."""
    what = "re-run client request" if verdict.served else "probe"
    reason = (
        f"token {verdict.first_difference} of the {what} differs from "
        f"{verdict.reference.signature if verdict.reference else 'the reference'}"
    )
    return route_quarantine(
        model_key=model_key,
        signature=verdict.plan.signature,
        suspects=verdict.suspects,
        reason=reason,
        now=now,
        lookback=lookback,
        on_served=verdict.served,
    )


def route_quarantine(
    *,
    model_key: str,
    signature: str,
    suspects: Sequence[str],
    reason: str,
    now: datetime,
    lookback: timedelta,
    on_served: bool = False,
    on_quarantine: Callable[[], None] | None = None,
) -> bool:
    """Quarantine the route, or count one more strike; True when it is newly quarantined.

    ``on_served``: the evidence is what the route served clients (an answer
    its re-runs contradict, a head that overran a client's limits). Such a
    quarantine is never re-probed nor released by the fixed probe, which a
    node can tell from traffic and answer honestly: an operator releases it.

    ``corrupt_since`` (where the audit's refunds start) is ``lookback`` back:
    a probe the route once passed proves nothing about what it served
    clients (a node may answer probes honestly), so every request in the
    audit window is refunded. The suspects' reputation is halved only when
    the evidence names one node: a route found wrong whose fault could lie
    with several is kept out of the choice, and nobody's standing pays for
    what the evidence cannot pin on them. ``on_quarantine`` runs after the
    commit when the route is newly quarantined.
    """
    with transaction.atomic():
        active = _active_quarantine_locked(model_key, signature)
        if active is not None:
            active.strikes += 1
            active.next_probe_at = now + reprobe_delay(active.strikes)
            active.on_served = active.on_served or on_served
            active.save(update_fields=["strikes", "next_probe_at", "on_served"])
            return False
        try:
            with transaction.atomic():
                RouteQuarantine.objects.create(
                    on_served=on_served,
                    model_key=model_key,
                    signature=signature,
                    suspects=list(suspects),
                    reason=reason[:2000],
                    corrupt_since=now - lookback,
                    quarantined_at=now,
                    next_probe_at=now + reprobe_delay(1),
                )
        except IntegrityError:
            return False  # a probe running at the same time quarantined it first
        if len(suspects) == 1:
            Node.objects.filter(pk__in=suspects).update(
                reputation=F("reputation") * REPUTATION_PENALTY
            )
        outbox_put(
            kind=ROUTE_QUARANTINED,
            subject=signature,
            payload={
                "model": model_key,
                "signature": signature,
                "nodes": list(suspects),
                "reason": reason,
            },
        )
        if on_quarantine is not None:
            transaction.on_commit(on_quarantine)
    return True


def _release(verdict: Verdict, model_key: str, now: datetime) -> bool:
    """Release the route's active quarantine, if any; True when one was released."""
    signature = verdict.plan.signature
    with transaction.atomic():
        active = _active_quarantine_locked(model_key, signature)
        if active is None or active.on_served:
            return False
        active.released_at = now
        active.save(update_fields=["released_at"])
        if len(active.suspects) == 1:  # only a lone suspect was penalised
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
    """Signatures of the model's quarantined routes whose next probe is due (never one
    found on what it served: the fixed probe cannot clear it)."""
    return set(
        RouteQuarantine.objects.filter(
            model_key=model_key, released_at__isnull=True, next_probe_at__lte=now, on_served=False
        ).values_list("signature", flat=True)
    )


def quarantines_active(*, model_key: str) -> set[str]:
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
                released_at__isnull=True, next_probe_at__lte=now, on_served=False
            ).values_list("model_key", flat=True)
        )
    )


def route_quarantines_active() -> frozenset[ArmKey]:
    """The (model key, signature) of every route the probe quarantines now."""
    active = RouteQuarantine.objects.filter(released_at__isnull=True)
    return frozenset(active.values_list("model_key", "signature"))
