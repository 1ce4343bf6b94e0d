"""Client API keys (stored hashed; the plain key is shown once), request records, billing,
and what billing audits flag and refund."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import models


class ApiKey(models.Model):
    name = models.CharField(max_length=100)
    prefix = models.CharField(
        max_length=16, help_text="The key's first characters, to recognise it"
    )
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked = models.BooleanField(default=False)
    # The key's share of the network (ADR-0004, "Auth and limits"); blank: the
    # deployment's MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT / _KV_TOKENS_IN_FLIGHT.
    max_requests_in_flight = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Requests this key may have in flight at once (blank: the deployment's default)",
    )
    max_kv_tokens_in_flight = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="KV tokens its requests in flight may reserve in all, (prompt + max_tokens) "
        "× choices each (blank: the deployment's default)",
    )

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class KeyLease(models.Model):
    """One request of ``api_key`` in flight and the KV tokens it reserves, until
    ``expires_at``: renewed while the request runs, deleted when it ends, and
    ignored once expired (a tracker that died leaks nothing for longer)."""

    request_id = models.UUIDField(primary_key=True)
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="leases")
    tokens = models.PositiveBigIntegerField()
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["api_key", "expires_at"])]

    def __str__(self) -> str:
        return f"{self.request_id}: {self.tokens} tokens"


class RequestStatus(models.TextChoices):
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Failed by the network after some of its choices were sent whole (``n > 1``,
    # streamed): billed for those choices only.
    PARTIAL = "partial"


class RequestApi(models.TextChoices):
    """The API a request came through (its endpoint's answer says which)."""

    CHAT_COMPLETIONS = "chat.completions", "Chat Completions"
    COMPLETIONS = "completions", "Completions (legacy)"
    MESSAGES = "messages", "Anthropic Messages"
    RESPONSES = "responses", "OpenAI Responses"


class ChatRequest(models.Model):
    """One client completion request as the tracker served it, whichever API it came
    through (``api``)."""

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
    # Blank: recorded before the API was.
    api = models.CharField(
        max_length=24,
        choices=RequestApi.choices,
        blank=True,
        help_text="The API the request came through",
    )
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    # Of the prompt tokens, those the route did not recompute (a prefix-cache hit).
    cached_tokens = models.PositiveIntegerField(default=0)
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
    """The charge for one request: completed, or what its client was sent (cancelled by a
    client that left, or partly served). Failed requests have none."""

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
    # ChatRequest.route_signature keeps only the last route of a failed-over
    # request; the audit needs every route that did work for it.
    route_signature = models.CharField(
        max_length=2000, blank=True, help_text="The route this hop was part of"
    )

    class Meta:
        ordering = ["billing", "start_layer"]

    def __str__(self) -> str:
        return f"{self.node_id}[{self.start_layer}-{self.end_layer}] {self.amount}"


class AuditStatus(models.TextChoices):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class AuditRun(models.Model):
    """One run of the billing audit and what it found (ADR-0007)."""

    started_at = models.DateTimeField(db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(
        max_length=16, choices=AuditStatus.choices, default=AuditStatus.RUNNING
    )
    window_start = models.DateTimeField(help_text="Requests started since then were audited")
    requests_checked = models.PositiveIntegerField(default=0)
    flagged = models.PositiveIntegerField(default=0, help_text="New flags this run")
    refunds = models.PositiveIntegerField(default=0, help_text="New refunds this run")
    refunded_amount = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal("0"))
    payout_violations = models.PositiveIntegerField(
        default=0, help_text="Bills whose payouts and fee exceed the charge"
    )
    charged_failures = models.PositiveIntegerField(
        default=0, help_text="Failed requests found charged"
    )
    findings = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"audit {self.pk} at {self.started_at:%Y-%m-%d %H:%M} ({self.status})"


class FlagReason(models.TextChoices):
    SHORT_MULTI_HOP = "short_multi_hop", "short multi-hop completion"


class AuditFlag(models.Model):
    """A request an audit found suspicious; at most one flag per request and reason."""

    request = models.ForeignKey(ChatRequest, on_delete=models.CASCADE, related_name="flags")
    reason = models.CharField(max_length=32, choices=FlagReason.choices)
    detail = models.TextField(blank=True)
    audit_run = models.ForeignKey(AuditRun, on_delete=models.PROTECT, related_name="flags")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["request", "reason"], name="audit_flag_once")
        ]

    def __str__(self) -> str:
        return f"{self.request_id}: {self.reason}"


class RefundReason(models.TextChoices):
    CORRUPT_ROUTE = "corrupt_route", "served by a route the probe found corrupt"
    CHARGED_FAILURE = "charged_failure", "a failed request was charged"


class Refund(models.Model):
    """Money given back for one bill. One per bill (the unique key makes refunds
    idempotent: two audits racing over the same bill refund it once)."""

    billing = models.OneToOneField(BillingRecord, on_delete=models.PROTECT, related_name="refund")
    amount = models.DecimalField(max_digits=18, decimal_places=6)
    reason = models.CharField(max_length=32, choices=RefundReason.choices)
    detail = models.TextField(blank=True)
    audit_run = models.ForeignKey(AuditRun, on_delete=models.PROTECT, related_name="refund_set")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"refund {self.amount} of {self.billing.request_id} ({self.reason})"


class ServedAnswer(models.Model):
    """A recent request as a route served it, kept only until the probe re-runs it.

    The route-equivalence probe (ADR-0007) re-runs a sample of real requests
    on other routes and compares the answers: a node cannot tell such a probe
    from traffic, because the answer judged is the one it gave a client. Kept
    at most ``MESHNET_PROBE_SAMPLE_SIZE`` per model and
    ``MESHNET_PROBE_SAMPLE_MAX_AGE`` seconds, never shown, deleted once
    checked (``tracker_app.served_answers``).
    """

    model_key = models.CharField(max_length=200)
    request_id = models.UUIDField(help_text="The ChatRequest it answered")
    signature = models.CharField(max_length=2000)
    hops = models.JSONField(help_text="The route that served it")
    request = models.JSONField(help_text="Prompt and parameters, as the head was sent them")
    token_ids = models.JSONField(help_text="The answer's token ids, as relayed to the client")
    logprobs = models.JSONField(default=list, help_text="Their logprob entries, when asked")
    served_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["model_key", "served_at"])]

    def __str__(self) -> str:
        return f"{self.request_id} on {self.signature}"
