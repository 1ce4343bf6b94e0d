"""What routing keeps in the database: learned arms, their history, prunes and probe verdicts.

The arms themselves are an in-process cache (``stats.RouteStatsStore``);
these tables are their durable copy (ADR-0003) and the route-equivalence
probe's record (ADR-0007). Rows name models by key and routes by signature,
as the store does, so a row outlives the nodes and catalogue entries it names.
"""

from __future__ import annotations

from django.db import models


class RouteArm(models.Model):
    """One tracker's own learned speed of one route, as of its last sync."""

    tracker_id = models.CharField(max_length=100)
    model_key = models.CharField(max_length=64)
    signature = models.CharField(max_length=2000)
    epoch = models.PositiveBigIntegerField()
    tps = models.FloatField(help_text="EWMA of end-to-end tokens/s")
    mass = models.FloatField(help_text="Decayed sample mass at the last sample")
    samples = models.PositiveBigIntegerField()
    last_sample_at = models.DateTimeField(db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model_key", "signature", "tracker_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tracker_id", "model_key", "signature"], name="route_arm_one_per_tracker"
            )
        ]

    def __str__(self) -> str:
        return f"{self.signature} @ {self.tracker_id}"


class RouteArmSnapshot(models.Model):
    """An arm as it stood at ``taken_at``: the tokens/s history, kept for a retention period."""

    tracker_id = models.CharField(max_length=100)
    model_key = models.CharField(max_length=64)
    signature = models.CharField(max_length=2000)
    epoch = models.PositiveBigIntegerField()
    tps = models.FloatField()
    mass = models.FloatField()
    samples = models.PositiveBigIntegerField()
    taken_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-taken_at"]
        indexes = [models.Index(fields=["model_key", "signature", "taken_at"])]

    def __str__(self) -> str:
        return f"{self.signature} {self.tps:.1f} tok/s at {self.taken_at:%Y-%m-%d %H:%M}"


class PrunedArm(models.Model):
    """An arm the prune job deleted: the tracker that owned it drops it at its next sync.

    Only the state whose last sample is ``last_sample_at`` (or older) is
    dropped: a sample the tracker took after the prune decision survives.
    """

    tracker_id = models.CharField(max_length=100)
    model_key = models.CharField(max_length=64)
    signature = models.CharField(max_length=2000)
    last_sample_at = models.DateTimeField()
    pruned_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"pruned {self.signature} @ {self.tracker_id}"


class ProbeOutcome(models.TextChoices):
    REFERENCE = "reference", "reference"
    AGREED = "agreed", "agreed"
    DISAGREED = "disagreed", "disagreed"
    FAILED = "failed", "failed"
    INCONCLUSIVE = "inconclusive", "inconclusive"


class RouteProbe(models.Model):
    """One route's answer to the fixed greedy probe, and the verdict on it."""

    run_id = models.UUIDField(db_index=True, help_text="The probe run this belongs to")
    model_key = models.CharField(max_length=64)
    epoch = models.PositiveBigIntegerField()
    signature = models.CharField(max_length=2000)
    hops = models.JSONField(default=list)
    outcome = models.CharField(max_length=16, choices=ProbeOutcome.choices)
    token_ids = models.JSONField(default=list)
    reference_signature = models.CharField(max_length=2000, blank=True)
    first_difference = models.PositiveIntegerField(
        null=True, blank=True, help_text="Index of the first token that differs"
    )
    tie_gap = models.FloatField(
        null=True,
        blank=True,
        help_text=(
            "At the first difference, how far below its own choice each route put the "
            "other's token, summed (nats); within the margin, the routes agree (ADR-0015)"
        ),
    )
    suspects = models.JSONField(default=list, help_text="Node ids blamed for the difference")
    error = models.TextField(blank=True)
    elapsed_ms = models.FloatField(null=True, blank=True)
    probed_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-probed_at", "id"]

    def __str__(self) -> str:
        return f"{self.signature}: {self.outcome}"


class RouteQuarantine(models.Model):
    """A route the probe found answering unlike the whole model: out of every choice.

    Active while ``released_at`` is null (at most one active row per route).
    ``corrupt_since`` is the start of the window whose charges the audit
    refunds (the audit window back from the quarantine: ADR-0007).
    ``on_served`` quarantines were found on what the route served clients:
    the fixed probe, which a node can tell from traffic, never releases them.
    """

    model_key = models.CharField(max_length=64)
    signature = models.CharField(max_length=2000)
    suspects = models.JSONField(
        default=list, help_text="Node ids the evidence points at (a lone one loses reputation)"
    )
    reason = models.TextField(blank=True)
    strikes = models.PositiveIntegerField(default=1, help_text="Disagreeing probes in a row")
    corrupt_since = models.DateTimeField()
    quarantined_at = models.DateTimeField(db_index=True)
    next_probe_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    on_served = models.BooleanField(
        default=False,
        help_text="Found on answers it served clients: released only by an operator",
    )

    class Meta:
        ordering = ["-quarantined_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["model_key", "signature"],
                condition=models.Q(released_at__isnull=True),
                name="route_quarantine_one_active",
            )
        ]

    def __str__(self) -> str:
        state = "released" if self.released_at else "active"
        return f"{self.signature} ({state})"

    @property
    def active(self) -> bool:
        return self.released_at is None
