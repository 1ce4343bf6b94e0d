"""Admin for the node registry (with the operator's drain/ban/unban actions), the model
catalogue and topology epochs."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from nodes_app.model_intake import (
    ModelRefused,
    language_model_add,
    language_model_draft_check,
    model_weights_read,
)
from nodes_app.models import LanguageModel, Node, NodeStatus, TopologyEpoch
from nodes_app.services import node_set_status


def _set_status(
    request: HttpRequest, queryset: QuerySet[Node], status: NodeStatus, verb: str
) -> None:
    changed = sum(node_set_status(node=node, new_status=status) for node in queryset)
    messages.success(request, f"{verb} {changed} node(s).")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin[Node]):
    list_display = [
        "id",
        "model",
        "shard",
        "status",
        "endpoint",
        "hardware",
        "device_name",
        "benchmark_tps",
        "measured_tps",
        "active_sessions",
        "queue_depth",
        "reputation",
        "last_heartbeat_at",
    ]
    list_filter = ["status", "model", "hardware"]
    search_fields = ["id", "wallet", "endpoint", "device_name"]
    readonly_fields = ["id", "wallet", "registered_at", "last_heartbeat_at"]
    ordering = ["model__key", "shard_start", "id"]
    actions = ["drain", "ban", "unban"]

    @admin.display(description="layers", ordering="shard_start")
    def shard(self, node: Node) -> str:
        return f"{node.shard_start}-{node.shard_end}"

    @admin.action(description="Drain: finish running work, take no new routes")
    def drain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        _set_status(request, queryset, NodeStatus.DRAINING, "Drained")

    @admin.action(description="Ban: take no routes and refuse registration")
    def ban(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        _set_status(request, queryset, NodeStatus.BANNED, "Banned")

    @admin.action(description="Unban: back to offline until the node's next heartbeat")
    def unban(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        _set_status(
            request, queryset.filter(status=NodeStatus.BANNED), NodeStatus.OFFLINE, "Unbanned"
        )


class LanguageModelForm(forms.ModelForm[LanguageModel]):
    """The model form: the layer count and context length come from the weights, as with
    ``add_model``, and weights the runtime cannot serve are refused with the reason; so is
    a draft model whose tokenizer is not the model's."""

    class Meta:
        model = LanguageModel
        fields = [
            "key",
            "display_name",
            "weight_source",
            "prompt_price_per_1k",
            "completion_price_per_1k",
            "cached_prompt_price_per_1k",
            "prefix_cache_shared",
            "draft",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["display_name"].required = False
        self.fields["display_name"].help_text = "Default: the key"
        if not self.instance._state.adding:
            drafts = self.fields["draft"]
            assert isinstance(drafts, forms.ModelChoiceField)
            drafts.queryset = LanguageModel.objects.exclude(pk=self.instance.pk)

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        self._read_weights(cleaned)
        draft = cleaned.get("draft")
        changed = {"draft", "weight_source"} & set(self.changed_data)
        if draft is not None and changed and not self.errors:
            try:
                language_model_draft_check(
                    key=cleaned.get("key") or self.instance.key,
                    weight_source=cleaned["weight_source"],
                    draft=draft,
                )
            except ModelRefused as refused:
                raise ValidationError({"draft": refused.message}) from None
        return cleaned

    def _read_weights(self, cleaned: dict[str, Any]) -> None:
        """A new or changed weight source read: its layers and context onto the row."""
        adding = self.instance._state.adding
        source = cleaned.get("weight_source")
        if source is None or not (adding or "weight_source" in self.changed_data):
            return  # shipped models' built-in sources are never re-read
        try:
            weights = model_weights_read(weight_source=source)
        except ModelRefused as refused:
            raise ValidationError({"weight_source": refused.message}) from None
        if not adding and weights.num_layers != self.instance.num_layers:
            raise ValidationError(
                {
                    "weight_source": f"these weights have {weights.num_layers} layers, but "
                    f"nodes serve {self.instance.key} as {self.instance.num_layers}: "
                    "add them under a new key"
                }
            )
        cleaned["weight_source"] = weights.weight_source
        self.instance.num_layers = weights.num_layers
        self.instance.context_length = weights.context_length


@admin.register(LanguageModel)
class LanguageModelAdmin(admin.ModelAdmin[LanguageModel]):
    form = LanguageModelForm
    list_display = [
        "key",
        "display_name",
        "num_layers",
        "context_length",
        "weight_source",
        "prompt_price_per_1k",
        "completion_price_per_1k",
        "cached_prompt_price_per_1k",
        "prefix_cache_shared",
        "draft",
        "chat_template_fault",
    ]
    list_select_related = ["draft"]
    search_fields = ["key", "display_name", "weight_source"]
    readonly_fields = ["num_layers", "context_length"]

    def save_model(
        self,
        request: HttpRequest,
        obj: LanguageModel,
        form: forms.ModelForm[LanguageModel],
        change: bool,
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # A new model is added the one way add_model adds it.
        added = language_model_add(
            key=obj.key,
            weight_source=obj.weight_source,
            display_name=obj.display_name,
            prompt_price_per_1k=obj.prompt_price_per_1k,
            completion_price_per_1k=obj.completion_price_per_1k,
            draft=obj.draft.key if obj.draft is not None else None,
        )
        obj.pk = added.pk
        obj.refresh_from_db()


@admin.register(TopologyEpoch)
class TopologyEpochAdmin(admin.ModelAdmin[TopologyEpoch]):
    list_display = ["model", "number", "reason", "changed_at"]
    list_filter = ["model"]
    # Epochs change only through node events; editing them by hand would
    # silently un-stale route statistics.
    readonly_fields = ["model", "number", "reason", "changed_at"]

    def has_add_permission(self, request: object) -> bool:
        return False
