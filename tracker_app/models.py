"""Client API keys. Keys are stored hashed; the plain key is shown once."""

from __future__ import annotations

import uuid

from django.db import models


class ApiKey(models.Model):
    name = models.CharField(max_length=100)
    prefix = models.CharField(
        max_length=16, help_text="The key's first characters, to recognise it"
    )
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class RequestStatus(models.TextChoices):
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ChatRequest(models.Model):
    """One client chat request as the tracker served it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    api_key = models.ForeignKey(ApiKey, on_delete=models.PROTECT, related_name="requests")
    model = models.ForeignKey(
        "nodes_app.LanguageModel", on_delete=models.PROTECT, related_name="requests"
    )
    route_signature = models.CharField(max_length=2000, blank=True)
    mode = models.CharField(max_length=20, blank=True, help_text="How the route was chosen")
    status = models.CharField(
        max_length=16, choices=RequestStatus.choices, default=RequestStatus.PROCESSING
    )
    finish_reason = models.CharField(max_length=16, blank=True)
    error = models.TextField(blank=True)
    stream = models.BooleanField(default=False)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    time_to_first_token_ms = models.FloatField(null=True, blank=True)
    tokens_per_second = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["status", "-started_at"])]

    def __str__(self) -> str:
        return f"{self.id} {self.model_id} {self.status}"


class BillingRecord(models.Model):
    """The charge for one completed request. Failed requests have none."""

    request = models.OneToOneField(ChatRequest, on_delete=models.PROTECT, related_name="billing")
    prompt_charge = models.DecimalField(max_digits=18, decimal_places=6)
    completion_charge = models.DecimalField(max_digits=18, decimal_places=6)
    charge = models.DecimalField(max_digits=18, decimal_places=6)
    network_fee = models.DecimalField(max_digits=18, decimal_places=6)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.request_id}: {self.charge}"


class WorkUnit(models.Model):
    """What one hop did for one billed request, and what it earned."""

    billing = models.ForeignKey(BillingRecord, on_delete=models.CASCADE, related_name="work_units")
    node = models.ForeignKey("nodes_app.Node", on_delete=models.PROTECT, related_name="work_units")
    start_layer = models.PositiveIntegerField()
    end_layer = models.PositiveIntegerField()
    tokens = models.PositiveIntegerField(help_text="Positions this hop processed")
    units = models.PositiveBigIntegerField(help_text="tokens × layers run")
    amount = models.DecimalField(max_digits=18, decimal_places=6)

    class Meta:
        ordering = ["billing", "start_layer"]

    def __str__(self) -> str:
        return f"{self.node_id}[{self.start_layer}-{self.end_layer}] {self.amount}"
