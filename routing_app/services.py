"""Writes to the catalogue side of routing: topology epochs."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from routing_app.models import LanguageModel, TopologyEpoch


def topology_epoch_bump(*, model: LanguageModel, reason: str) -> int:
    """Advance ``model``'s topology epoch and return the new number.

    The one place epochs change: every join, leave and shard change calls it.
    The increment is a single UPDATE, so concurrent bumps never lose a count.
    """
    with transaction.atomic():
        epoch, _ = TopologyEpoch.objects.get_or_create(model=model)
        TopologyEpoch.objects.filter(pk=epoch.pk).update(
            number=F("number") + 1, reason=reason[:200]
        )
        epoch.refresh_from_db(fields=["number"])
    return epoch.number
