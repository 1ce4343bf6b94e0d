"""Admin for the node registry (with the operator's drain/ban/unban actions), the model
catalogue and topology epochs."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

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
