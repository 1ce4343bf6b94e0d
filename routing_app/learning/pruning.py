"""The prune job: forget arms nobody sampled for a day, and old history (ADR-0003).

Runs in the Celery worker (``routing.prune_arms``). It deletes the durable
arms without a sample for the TTL and writes a ``PrunedArm`` record for
each; every tracker reads those records at its next sync and drops the arm
from memory, unless it took a sample after the decision.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.db import transaction

from routing_app.models import PrunedArm, RouteArm, RouteArmSnapshot

# Long enough for every tracker that is running to have read a record; one
# that was down longer restores from RouteArm rows, where the arm is gone.
PRUNED_RECORD_RETENTION = timedelta(days=1)


@dataclass(frozen=True)
class PruneSummary:
    """How many arms, snapshots and old prune records one run deleted."""

    arms: int
    snapshots: int
    records: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def route_arms_prune(
    *, now: datetime, ttl: timedelta, snapshot_retention: timedelta
) -> PruneSummary:
    """Delete arms without a sample since ``now - ttl`` and snapshots older than the retention.

    Each deleted arm gets a ``PrunedArm`` record in the same transaction, so
    trackers learn of exactly the deletions that happened. Safe to run twice
    at once: the rows are locked (PostgreSQL) or the whole run holds the
    write lock (SQLite), so an arm is deleted, and recorded, once.
    """
    cutoff = now - ttl
    with transaction.atomic():
        stale = list(
            RouteArm.objects.select_for_update()
            .filter(last_sample_at__lt=cutoff)
            .values_list("pk", "tracker_id", "model_key", "signature", "last_sample_at")
        )
        if stale:
            RouteArm.objects.filter(pk__in=[row[0] for row in stale]).delete()
            PrunedArm.objects.bulk_create(
                PrunedArm(
                    tracker_id=tracker_id,
                    model_key=model_key,
                    signature=signature,
                    last_sample_at=last_sample_at,
                    pruned_at=now,
                )
                for _, tracker_id, model_key, signature, last_sample_at in stale
            )
    snapshots, _ = RouteArmSnapshot.objects.filter(taken_at__lt=now - snapshot_retention).delete()
    records, _ = PrunedArm.objects.filter(pruned_at__lt=now - PRUNED_RECORD_RETENTION).delete()
    return PruneSummary(arms=len(stale), snapshots=snapshots, records=records)
