"""Rows of the durable guards: once-only claims and fixed-window counters."""

from __future__ import annotations

from django.db import models


class OnceClaim(models.Model):
    """A value claimed once within ``scope`` (e.g. a registration's signature) until
    ``expires_at``.

    Only a digest of the value is kept: the guard needs to recognise it, not
    to read it.
    """

    scope = models.CharField(max_length=64)
    digest = models.CharField(max_length=64)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "digest"], name="guards_claim_once"),
        ]

    def __str__(self) -> str:
        return f"{self.scope}: {self.digest[:12]}"


class WindowCounter(models.Model):
    """How many hits ``key`` took in the fixed window starting at ``window_start``
    (Unix seconds)."""

    key = models.CharField(max_length=200)
    window_start = models.BigIntegerField()
    count = models.PositiveIntegerField(default=0)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["key", "window_start"], name="guards_one_counter_per_window"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} @ {self.window_start}: {self.count}"
