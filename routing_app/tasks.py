"""Background jobs of routing: pruning the durable arms (the probe is tracker_app's)."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from routing_app.learning.pruning import route_arms_prune


@shared_task(name="routing.prune_arms", ignore_result=False)
def prune_arms() -> dict[str, int]:
    """Delete arms without a sample for the TTL and old snapshots; how many of each."""
    return route_arms_prune(
        now=timezone.now(),
        ttl=timedelta(seconds=settings.MESHNET_ROUTE_ARM_TTL),
        snapshot_retention=timedelta(seconds=settings.MESHNET_ROUTE_SNAPSHOT_RETENTION),
    ).to_dict()
