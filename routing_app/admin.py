"""Admin for the model catalogue and topology epochs."""

from __future__ import annotations

from django.contrib import admin

from routing_app.models import LanguageModel, TopologyEpoch


@admin.register(LanguageModel)
class LanguageModelAdmin(admin.ModelAdmin[LanguageModel]):
    list_display = [
        "key",
        "display_name",
        "num_layers",
        "weight_source",
        "prompt_price_per_1k",
        "completion_price_per_1k",
    ]
    search_fields = ["key", "display_name", "weight_source"]


@admin.register(TopologyEpoch)
class TopologyEpochAdmin(admin.ModelAdmin[TopologyEpoch]):
    list_display = ["model", "number", "reason", "changed_at"]
    list_filter = ["model"]
    # Epochs change only through node events; editing them by hand would
    # silently un-stale route statistics.
    readonly_fields = ["model", "number", "reason", "changed_at"]

    def has_add_permission(self, request: object) -> bool:
        return False
