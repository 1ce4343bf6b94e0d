"""Reads of the model catalogue and topology epochs."""

from __future__ import annotations

from routing_app.models import LanguageModel, TopologyEpoch


def topology_epoch_current(*, model: LanguageModel) -> int:
    """The model's current topology epoch (0 before any node ever joined)."""
    number = TopologyEpoch.objects.filter(model=model).values_list("number", flat=True).first()
    return number or 0
