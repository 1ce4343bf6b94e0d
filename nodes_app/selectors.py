"""Reads of the model catalogue and topology epochs: the one place a model is found by key."""

from __future__ import annotations

from meshnet_site.errors import DomainError, ErrorKind
from nodes_app.models import LanguageModel, TopologyEpoch


class ModelNotFound(DomainError):
    """No model of the tracker's catalogue has the key the caller asked for."""

    kind = ErrorKind.NOT_FOUND
    code = "model_not_found"

    def __init__(self, key: str) -> None:
        super().__init__(f"The model {key!r} does not exist; GET /v1/models lists the served ones")
        self.key = key


def language_model_get(*, key: str) -> LanguageModel:
    """The catalogue's model named ``key``; raises ``ModelNotFound`` when there is none."""
    model = LanguageModel.objects.filter(key=key).first()
    if model is None:
        raise ModelNotFound(key)
    return model


def language_model_keys() -> list[str]:
    """Every catalogue model's key, sorted (for messages that name the known ones)."""
    return list(LanguageModel.objects.order_by("key").values_list("key", flat=True))


def topology_epoch_current(*, model: LanguageModel) -> int:
    """The model's current topology epoch (0 before any node ever joined)."""
    number = TopologyEpoch.objects.filter(model=model).values_list("number", flat=True).first()
    return number or 0
