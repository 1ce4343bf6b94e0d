"""Admin for what routing keeps: learned arms and their history, probes and quarantines.

All of it is a record of what was measured or decided, so nothing is edited
here, except that an operator may release a quarantine by hand.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from routing_app.models import RouteArm, RouteArmSnapshot, RouteProbe, RouteQuarantine


class ReadOnlyAdmin(admin.ModelAdmin[Any]):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(RouteArm)
class RouteArmAdmin(ReadOnlyAdmin):
    list_display = [
        "signature",
        "model_key",
        "tracker_id",
        "epoch",
        "tps",
        "samples",
        "last_sample_at",
    ]
    list_filter = ["model_key", "tracker_id"]
    search_fields = ["signature"]


@admin.register(RouteArmSnapshot)
class RouteArmSnapshotAdmin(ReadOnlyAdmin):
    list_display = ["taken_at", "signature", "tracker_id", "epoch", "tps", "samples"]
    list_filter = ["model_key", "tracker_id"]
    search_fields = ["signature"]
    date_hierarchy = "taken_at"


@admin.register(RouteProbe)
class RouteProbeAdmin(ReadOnlyAdmin):
    list_display = [
        "probed_at",
        "model_key",
        "epoch",
        "signature",
        "outcome",
        "first_difference",
        "tie_gap",
    ]
    list_filter = ["outcome", "model_key"]
    search_fields = ["signature", "run_id"]
    date_hierarchy = "probed_at"


@admin.register(RouteQuarantine)
class RouteQuarantineAdmin(ReadOnlyAdmin):
    list_display = [
        "quarantined_at",
        "signature",
        "suspects",
        "strikes",
        "next_probe_at",
        "released_at",
    ]
    list_filter = [("released_at", admin.EmptyFieldListFilter), "model_key"]
    search_fields = ["signature", "reason"]
    actions = ["release"]

    @admin.action(description="Release the selected routes (trackers take them back at once)")
    def release(self, request: HttpRequest, queryset: QuerySet[RouteQuarantine]) -> None:
        queryset.filter(released_at__isnull=True).update(released_at=timezone.now())
