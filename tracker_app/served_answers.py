"""The probe's sample of served requests, and what a head that overran its limits costs.

The route-equivalence probe (ADR-0007) judges routes on answers they gave
clients: a node cannot answer such a probe honestly and clients dishonestly,
since the answer judged *is* a client's. When a request completes,
:func:`served_answers_record` keeps each of its choices that one route served
from start to end (no failover): the prompt and parameters its head was
sent, the route, and the token ids (and logprob entries, when the client
asked) the tracker relayed. About ``MESHNET_PROBE_SAMPLE_SIZE`` per model
(the newest; at most :data:`TRIM_EVERY` more between trims), for at most
``MESHNET_PROBE_SAMPLE_MAX_AGE`` seconds; shown nowhere.
:func:`served_answers_take` hands the probe a few at random and deletes them
in the same transaction: a sample is checked once, then gone.

A choice whose head ran past the client's stop sequence or ``max_tokens``
(:class:`~tracker_app.completions.generation.Overrun`) is not sampled: its
route is quarantined at once, the head named (:func:`route_quarantine`).
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.logprobs import TokenLogprob
from nodes_app.protocol.sampling import SAMPLING_FIELDS, SamplingParams
from routing_app.exclusions.probe_verdicts import ProbeAnswer
from routing_app.exclusions.quarantines import route_quarantine
from routing_app.planning.route_plan import Hop, RoutePlan
from tracker_app.billing.audits import billing_audit_queue
from tracker_app.completions.generation import Generation
from tracker_app.models import ServedAnswer

logger = logging.getLogger(__name__)

# The sample is trimmed at every this many rows kept (of any model), not at each: a
# completion's cost stays one insert, and a model holds at most ``keep`` + this many.
TRIM_EVERY = 8

# Fields of the head's request the probe does not re-send as they were: its id and
# plan are the re-run's own, and a kept choice was never resumed nor echoed.
_NOT_KEPT = ("request_id", "plan", "resume_token_ids", "echo")


@dataclass(frozen=True)
class ServedSample:
    """One kept choice: the route that served it, what its head was sent, its answer."""

    model_key: str
    request_id: uuid.UUID
    plan: RoutePlan
    request: dict[str, Any]
    answer: ProbeAnswer

    @property
    def greedy(self) -> bool:
        """Whether the request was greedy (else sampled, with the seed it was sent)."""
        fields = {key: self.request[key] for key in SAMPLING_FIELDS if key in self.request}
        return SamplingParams.from_mapping(fields).greedy

    def rerun(self, plan: RoutePlan, *, request_id: str, top_logprobs: int) -> GenerateRequest:
        """The same request (prompt, sampling and seed, stop, budget) on ``plan``, with each
        token's logprob and ``top_logprobs`` alternatives (ADR-0015's tie rule needs them)."""
        body = {
            **self.request,
            "request_id": request_id,
            "plan": {"model": plan.model_key, "hops": plan.to_dict()},
            "logprobs": True,
            "top_logprobs": max(top_logprobs, int(self.request.get("top_logprobs", 0))),
        }
        return GenerateRequest.parse(body)


def served_request_keep(
    *, model_key: str, request_id: uuid.UUID, generations: Sequence[Generation]
) -> None:
    """:func:`served_answers_record` with the deployment's settings, now; best effort
    (the request is billed already: a failure here is logged, not the client's)."""
    try:
        served_answers_record(
            model_key=model_key,
            request_id=request_id,
            generations=generations,
            now=timezone.now(),
            keep=settings.MESHNET_PROBE_SAMPLE_SIZE,
            max_age=timedelta(seconds=settings.MESHNET_PROBE_SAMPLE_MAX_AGE),
            lookback=timedelta(seconds=settings.MESHNET_AUDIT_WINDOW),
            on_quarantine=billing_audit_queue,
        )
    except Exception:
        logger.warning("request %s: could not keep it for the probe", request_id, exc_info=True)


def served_answers_record(
    *,
    model_key: str,
    request_id: uuid.UUID,
    generations: Sequence[Generation],
    now: datetime,
    keep: int,
    max_age: timedelta,
    lookback: timedelta,
    on_quarantine: Callable[[], None] | None = None,
) -> int:
    """Keep the request's choices for the probe; quarantine a route whose head overran.

    Trims the model's samples to the newest ``keep`` (none older than
    ``max_age``) at every :data:`TRIM_EVERY`-th row. Returns how many choices
    were kept.
    """
    kept = 0
    for generation in generations:
        overrun = generation.overrun
        if overrun is not None:
            route_quarantine(
                model_key=model_key,
                signature=overrun.segment.signature,
                suspects=(overrun.node_id,),
                reason=f"head {overrun.node_id} {overrun.what}",
                now=now,
                lookback=lookback,
                on_served=True,
                on_quarantine=on_quarantine,
            )
            continue
        sent = generation.sent
        if keep <= 0 or sent is None or len(generation.segments) != 1 or not generation.token_ids:
            continue
        body = {k: v for k, v in sent.to_json().items() if k not in _NOT_KEPT}
        logprobs = generation.logprobs
        aligned = len(logprobs) == len(generation.token_ids)
        row = ServedAnswer.objects.create(
            model_key=model_key,
            request_id=request_id,
            signature=generation.segments[0].signature,
            hops=generation.segments[0].decision.plan.to_dict(),
            request=body,
            token_ids=list(generation.token_ids),
            logprobs=[entry.to_json() for entry in logprobs] if aligned else [],
            served_at=now,
        )
        kept += 1
        if row.pk % TRIM_EVERY == 0:
            _trim(model_key=model_key, now=now, keep=keep, max_age=max_age)
    return kept


def _trim(*, model_key: str, now: datetime, keep: int, max_age: timedelta) -> None:
    """Delete the model's samples past ``max_age`` and all but the newest ``keep``."""
    rows = ServedAnswer.objects.filter(model_key=model_key)
    rows.filter(served_at__lt=now - max_age).delete()
    surplus = rows.order_by("-served_at", "-pk").values_list("pk", flat=True)[keep:]
    ServedAnswer.objects.filter(pk__in=list(surplus)).delete()


def served_answers_purge(*, now: datetime, max_age: timedelta) -> int:
    """Delete every sample older than ``max_age``; how many."""
    deleted, _ = ServedAnswer.objects.filter(served_at__lt=now - max_age).delete()
    return deleted


def served_answers_take(
    *, model_key: str, count: int, now: datetime, max_age: timedelta, rng: random.Random
) -> list[ServedSample]:
    """Up to ``count`` of the model's samples, drawn at random, deleted as they are taken."""
    with transaction.atomic():
        rows = ServedAnswer.objects.select_for_update().filter(
            model_key=model_key, served_at__gte=now - max_age
        )
        pks = list(rows.values_list("pk", flat=True))
        chosen = rng.sample(pks, min(count, len(pks)))
        taken = list(ServedAnswer.objects.filter(pk__in=chosen))
        ServedAnswer.objects.filter(pk__in=chosen).delete()
    return [_sample(row) for row in taken]


def served_answer_models(*, now: datetime, max_age: timedelta) -> list[str]:
    """Keys of the models with samples waiting."""
    rows = ServedAnswer.objects.filter(served_at__gte=now - max_age)
    return sorted(set(rows.values_list("model_key", flat=True)))


def _sample(row: ServedAnswer) -> ServedSample:
    hops = tuple(
        Hop(hop["node_id"], hop["endpoint"], hop["start_layer"], hop["end_layer"])
        for hop in row.hops
    )
    plan = RoutePlan(row.model_key, hops[-1].end_layer, hops)
    answer = ProbeAnswer(
        token_ids=tuple(row.token_ids),
        logprobs=tuple(TokenLogprob.parse(entry) for entry in row.logprobs),
    )
    return ServedSample(row.model_key, row.request_id, plan, dict(row.request), answer)
