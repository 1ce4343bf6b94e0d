"""The durable copy of a tracker's route statistics, in the database (ADR-0003).

``DatabaseArmArchive`` is the ``ArmArchive`` a tracker's ``StatsSync`` writes
to: each sync upserts the arms that took samples (one ``RouteArm``
row per tracker and arm), adds a ``RouteArmSnapshot`` per arm at most every
``SNAPSHOT_INTERVAL_SECONDS``, reads the ``PrunedArm`` records written since
its last sync and the routes the probe quarantines. A starting
tracker restores its own rows, so a restart routes on what it had learned.

The chooser never waits on any of this: it runs in the sync thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Max

from routing_app.exclusions.quarantines import route_quarantines_active
from routing_app.learning.arms import ArmKey, ArmState, PrunedState
from routing_app.learning.sync import ArchiveNews
from routing_app.models import PrunedArm, RouteArm, RouteArmSnapshot

# A busy arm changes at every sync; its history needs far less resolution.
SNAPSHOT_INTERVAL_SECONDS = 60.0


def to_datetime(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


class DatabaseArmArchive:
    """One tracker's arms in ``RouteArm`` rows under ``tracker_id``.

    ``tracker_id`` must stay the same across the tracker's restarts (see
    ``routing_app.learning.tracker_store``) and differ between trackers running at once.
    """

    def __init__(
        self,
        *,
        tracker_id: str,
        snapshot_interval: float = SNAPSHOT_INTERVAL_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not tracker_id:
            raise ValueError("a durable archive needs a tracker id")
        self.tracker_id = tracker_id
        self.snapshot_interval = snapshot_interval
        self.monotonic = monotonic
        # PrunedArm ids up to this one were seen (None: not read yet).
        self._pruned_cursor: int | None = None
        self._snapshot_taken: dict[ArmKey, float] = {}

    def restore(self) -> list[tuple[ArmKey, ArmState]]:
        """This tracker's arms as last written; prunes before now are already applied."""
        self._pruned_cursor = PrunedArm.objects.aggregate(last=Max("id"))["last"] or 0
        return [
            (
                (row.model_key, row.signature),
                ArmState(row.tps, row.mass, row.last_sample_at.timestamp(), row.epoch, row.samples),
            )
            for row in RouteArm.objects.filter(tracker_id=self.tracker_id)
        ]

    def exchange(self, changed: Sequence[tuple[ArmKey, ArmState]]) -> ArchiveNews:
        """Upsert ``changed``, snapshot what is due; return new prunes and active quarantines."""
        if changed:
            self._write(changed)
        return ArchiveNews(pruned=self._new_prunes(), quarantined=route_quarantines_active())

    def _write(self, changed: Sequence[tuple[ArmKey, ArmState]]) -> None:
        rows = [
            RouteArm(
                tracker_id=self.tracker_id,
                model_key=key[0],
                signature=key[1],
                epoch=state.epoch,
                tps=state.value,
                mass=state.mass,
                samples=state.samples,
                last_sample_at=to_datetime(state.at),
            )
            for key, state in changed
        ]
        now = self.monotonic()
        due = [
            (key, state)
            for key, state in changed
            if now - self._snapshot_taken.get(key, -float("inf")) >= self.snapshot_interval
        ]
        with transaction.atomic():
            RouteArm.objects.bulk_create(
                rows,
                update_conflicts=True,
                unique_fields=["tracker_id", "model_key", "signature"],
                update_fields=["epoch", "tps", "mass", "samples", "last_sample_at", "updated_at"],
            )
            RouteArmSnapshot.objects.bulk_create(
                RouteArmSnapshot(
                    tracker_id=self.tracker_id,
                    model_key=key[0],
                    signature=key[1],
                    epoch=state.epoch,
                    tps=state.value,
                    mass=state.mass,
                    samples=state.samples,
                    taken_at=to_datetime(state.at),
                )
                for key, state in due
            )
        for key, _ in due:
            self._snapshot_taken[key] = now

    def _new_prunes(self) -> list[PrunedState]:
        records = PrunedArm.objects.order_by("id")
        if self._pruned_cursor is not None:
            records = records.filter(id__gt=self._pruned_cursor)
        pruned = []
        for record in records:
            self._pruned_cursor = record.pk
            key = (record.model_key, record.signature)
            self._snapshot_taken.pop(key, None)
            pruned.append(
                PrunedState(
                    key=key,
                    last_sample_at=record.last_sample_at.timestamp(),
                    own=record.tracker_id == self.tracker_id,
                )
            )
        return pruned
