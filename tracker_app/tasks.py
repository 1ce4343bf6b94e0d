"""Background jobs of the tracker: abandoned requests, route probes, billing audits.

Each task is thin: it reads its settings, calls one service, and returns a
JSON-ready summary (kept by django-celery-results for the probe and the
audit, next to their own ``RouteProbe`` and ``AuditRun`` rows).
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from nodes_app.models import LanguageModel
from routing_app.exclusions.quarantines import models_with_quarantines_due
from tracker_app.billing.audits import billing_audit
from tracker_app.completions.recording import chat_requests_fail_abandoned
from tracker_app.probes import route_probe_done, route_probes_run, served_answers_check
from tracker_app.served_answers import served_answer_models, served_answers_purge

# Longer than any generation runs (4,096 tokens at under 1 token/s).
ABANDONED_AFTER = timedelta(hours=3)


@shared_task(name="requests.fail_abandoned")
def fail_abandoned_requests() -> int:
    """Close requests a stopped tracker left processing; returns how many."""
    return chat_requests_fail_abandoned(now=timezone.now(), older_than=ABANDONED_AFTER)


@shared_task(name="routing.probe_routes", ignore_result=False)
def probe_routes(
    model_key: str | None = None, epoch: int | None = None, due_only: bool = False
) -> list[dict[str, Any]]:
    """Probe the candidate routes of one model (``model_key``) or of every model.

    ``epoch``: queued by that topology change; skipped when the model was
    already probed under it or has changed again. ``due_only``: only models
    with a quarantined route due for its re-probe. Then, whatever those say,
    ``MESHNET_PROBE_SAMPLE_CHECKS`` served requests of each model (of
    ``model_key``'s) are re-run and judged. Returns each run's summary.
    """
    now = timezone.now()
    models = LanguageModel.objects.order_by("key")
    if model_key is not None:
        models = models.filter(key=model_key)  # a model deleted since: nothing to do
    elif due_only:
        models = models.filter(key__in=models_with_quarantines_due(now=now))
    lookback = timedelta(seconds=settings.MESHNET_AUDIT_WINDOW)
    summaries = []
    for model in models:
        if epoch is not None and route_probe_done(model=model, epoch=epoch):
            continue
        summary = route_probes_run(model=model, now=now, lookback=lookback, due_only=due_only)
        if summary is not None:
            summaries.append(summary.to_dict())
    # Every run also judges a few answers routes served clients: the probe no node can
    # tell from traffic (ADR-0007).
    max_age = timedelta(seconds=settings.MESHNET_PROBE_SAMPLE_MAX_AGE)
    served_answers_purge(now=now, max_age=max_age)
    sampled = LanguageModel.objects.filter(key__in=served_answer_models(now=now, max_age=max_age))
    if model_key is not None:
        sampled = sampled.filter(key=model_key)
    for model in sampled.order_by("key"):
        checks = served_answers_check(
            model=model,
            now=now,
            lookback=lookback,
            count=settings.MESHNET_PROBE_SAMPLE_CHECKS,
            max_age=max_age,
            rng=random.Random(),
        )
        summaries += [summary.to_dict() for summary in checks]
    return summaries


@shared_task(name="billing.audit", ignore_result=False)
def audit_billing() -> dict[str, Any]:
    """Audit the window's requests (flags, refunds, payout checks); the run's counts."""
    run = billing_audit(
        now=timezone.now(),
        window=timedelta(seconds=settings.MESHNET_AUDIT_WINDOW),
        short_completion_tokens=settings.MESHNET_AUDIT_SHORT_COMPLETION_TOKENS,
    )
    return {
        "audit_run": run.pk,
        "requests_checked": run.requests_checked,
        "flagged": run.flagged,
        "refunds": run.refunds,
        "refunded_amount": str(run.refunded_amount),
        "payout_violations": run.payout_violations,
        "charged_failures": run.charged_failures,
    }
