"""Admin for client API keys (created with `create_api_key`, revoked here, their share of
requests and KV tokens in flight set and shown here), request and
billing records, and what billing audits flagged and refunded (filterable)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from tracker_app.api_keys.in_flight import KeyLimits, key_in_flight
from tracker_app.models import (
    ApiKey,
    AuditFlag,
    AuditRun,
    BillingRecord,
    ChatRequest,
    Refund,
    WorkUnit,
)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    """Keys with their share of the network: the limits in force (the key's own, or the
    deployment's default) and what the key has in flight now."""

    list_display = [
        "name",
        "prefix",
        "created_at",
        "revoked",
        "requests_in_flight",
        "kv_tokens_in_flight",
    ]
    list_filter = ["revoked"]
    search_fields = ["name", "prefix"]
    fields = [
        "name",
        "prefix",
        "created_at",
        "revoked",
        "max_requests_in_flight",
        "max_kv_tokens_in_flight",
        "requests_in_flight",
        "kv_tokens_in_flight",
    ]
    readonly_fields = ["prefix", "created_at", "requests_in_flight", "kv_tokens_in_flight"]
    actions = ["revoke"]

    @admin.display(description="requests in flight / limit")
    def requests_in_flight(self, obj: ApiKey) -> str:
        limits, held = KeyLimits.of(obj), key_in_flight(api_key=obj)
        own = "" if obj.max_requests_in_flight is not None else " (default)"
        return f"{held.requests} / {limits.requests}{own}"

    @admin.display(description="KV tokens in flight / limit")
    def kv_tokens_in_flight(self, obj: ApiKey) -> str:
        limits, held = KeyLimits.of(obj), key_in_flight(api_key=obj)
        own = "" if obj.max_kv_tokens_in_flight is not None else " (default)"
        return f"{held.kv_tokens} / {limits.kv_tokens}{own}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a key must be shown once at creation: use `create_api_key`

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        queryset.update(revoked=True)


class WorkUnitInline(admin.TabularInline[WorkUnit, BillingRecord]):
    model = WorkUnit
    extra = 0
    can_delete = False
    readonly_fields = ["node", "start_layer", "end_layer", "tokens", "units", "amount"]


@admin.register(ChatRequest)
class ChatRequestAdmin(admin.ModelAdmin[ChatRequest]):
    list_display = [
        "started_at",
        "model",
        "status",
        "mode",
        "prompt_tokens",
        "completion_tokens",
        "time_to_first_token_ms",
        "tokens_per_second",
        "finish_reason",
        "api",
        "api_key",
    ]
    list_filter = ["status", "mode", "model", "stream", "flags__reason", "billing__refund__reason"]
    search_fields = ["id", "route_signature", "api_key__name"]
    date_hierarchy = "started_at"

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # records of what happened are not edited


@admin.register(BillingRecord)
class BillingRecordAdmin(admin.ModelAdmin[BillingRecord]):
    list_display = ["created_at", "request", "charge", "network_fee", "refunded"]
    list_filter = [("refund", admin.EmptyFieldListFilter), "refund__reason"]
    search_fields = ["request__id"]
    inlines = [WorkUnitInline]

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.display(boolean=True, description="refunded")
    def refunded(self, obj: BillingRecord) -> bool:
        return hasattr(obj, "refund")


class ReadOnlyRecordAdmin(admin.ModelAdmin[Any]):
    """Audit results: written by the audit only."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(AuditRun)
class AuditRunAdmin(ReadOnlyRecordAdmin):
    list_display = [
        "started_at",
        "status",
        "requests_checked",
        "flagged",
        "refunds",
        "refunded_amount",
        "payout_violations",
        "charged_failures",
    ]
    list_filter = ["status"]
    date_hierarchy = "started_at"


@admin.register(AuditFlag)
class AuditFlagAdmin(ReadOnlyRecordAdmin):
    list_display = ["created_at", "request", "reason", "detail", "audit_run"]
    list_filter = ["reason"]
    search_fields = ["request__id"]


@admin.register(Refund)
class RefundAdmin(ReadOnlyRecordAdmin):
    list_display = ["created_at", "billing", "amount", "reason", "audit_run"]
    list_filter = ["reason"]
    search_fields = ["billing__request__id"]
