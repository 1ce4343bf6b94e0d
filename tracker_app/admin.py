"""Admin for client API keys (created with `create_api_key`, revoked here)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from tracker_app.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    list_display = ["name", "prefix", "created_at", "revoked"]
    list_filter = ["revoked"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix", "created_at"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a key must be shown once at creation: use `create_api_key`

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        queryset.update(revoked=True)
