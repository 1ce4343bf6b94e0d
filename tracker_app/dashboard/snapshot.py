"""Reads for the dashboard: each part of the snapshot as plain, JSON-ready dicts.

The same functions feed the page's first render (embedded as JSON) and the
websocket's ``snapshot`` and update messages (``tracker_app.dashboard.consumer``), so
the page draws one shape whichever way it arrived. Money is a decimal string
(never a float) and times are Unix seconds.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Count, Q, Sum
from django.utils import timezone

from nodes_app.events import node_row
from nodes_app.models import LanguageModel, Node, NodeStatus, TopologyEpoch
from routing_app.learning.tracker_store import route_stats_store
from routing_app.planning.route_plan import NodeRecord
from routing_app.planning.search import uncovered_layers
from routing_app.policies.config import RoutePolicyConfig
from routing_app.selectors import routing_table
from tracker_app.completions import console
from tracker_app.models import ApiKey, BillingRecord, ChatRequest, RequestStatus, WorkUnit

# Offline nodes stay listed this long after their last heartbeat, then drop off.
OFFLINE_LISTED_FOR = timedelta(hours=1)
RECENT_CALLS = 20
RECENT_BILLS = 20


def dashboard_snapshot() -> dict[str, Any]:
    """Everything the dashboard shows, as of now (the ``snapshot`` message's payload)."""
    return {
        "server_time": time.time(),
        "heartbeat_timeout": settings.MESHNET_NODE_HEARTBEAT_TIMEOUT,
        "models": models_overview(),
        "routing": routing_section(),
        "calls": {"in_flight": console.calls_in_flight(), "recent": calls_recent()},
        "billing": billing_summary(),
    }


# --- Overview ----------------------------------------------------------------


def models_overview() -> list[dict[str, Any]]:
    """Per catalogue model: layers, topology epoch, its nodes and the layers nobody serves.

    ``nodes`` lists every node that is not offline, and offline ones for
    ``OFFLINE_LISTED_FOR`` after they went silent. ``gaps`` are the
    inclusive layer ranges no *online* node serves.
    """
    epochs = {e.model_id: e for e in TopologyEpoch.objects.all()}
    listed_since = timezone.now() - OFFLINE_LISTED_FOR
    nodes = (
        Node.objects.select_related("model")
        .filter(~Q(status=NodeStatus.OFFLINE) | Q(last_heartbeat_at__gte=listed_since))
        .order_by("shard_start", "id")
    )
    by_model: dict[int, list[Node]] = {}
    for node in nodes:
        by_model.setdefault(node.model_id, []).append(node)
    overview = []
    for model in LanguageModel.objects.order_by("key"):
        served = by_model.get(model.pk, [])
        epoch = epochs.get(model.pk)
        overview.append(
            {
                "key": model.key,
                "display_name": model.display_name,
                "num_layers": model.num_layers,
                "epoch": epoch.number if epoch else 0,
                "epoch_reason": epoch.reason if epoch else "",
                "nodes": [node_row(node) for node in served],
                "gaps": coverage_gaps(model=model, nodes=served),
            }
        )
    return overview


def coverage_gaps(*, model: LanguageModel, nodes: list[Node]) -> list[list[int]]:
    """Inclusive ``[first, last]`` layer ranges that no online node of ``nodes`` serves."""
    online = [
        NodeRecord(node.pk, node.endpoint, node.shard_start, node.shard_end)
        for node in nodes
        if node.status == NodeStatus.ONLINE
    ]
    return [[first, last] for first, last in uncovered_layers(online, model.num_layers)]


# --- Routing (learned) -------------------------------------------------------


def routing_section(*, model_key: str | None = None) -> dict[str, Any]:
    """``GET /v1/routing``'s table (one model or all), each model with its tok/s series.

    ``series`` maps a route's signature to ``[[unix time, tokens/s], …]``:
    what completed requests on that route achieved over the last minutes,
    as this tracker saw them.
    """
    table = routing_table(
        model_key=model_key, store=route_stats_store(), config=RoutePolicyConfig.from_settings()
    )
    for model in table["models"]:
        model["series"] = console.route_series.for_model(model["model"])
    return table


# --- Call wall ---------------------------------------------------------------


def calls_recent(*, limit: int = RECENT_CALLS) -> list[dict[str, Any]]:
    """The latest finished requests of every tracker (completed, failed, cancelled)."""
    rows = (
        ChatRequest.objects.exclude(status=RequestStatus.PROCESSING)
        .select_related("model", "api_key", "billing")
        .order_by("-started_at")[:limit]
    )
    return [_call_of(row) for row in rows]


def call_record(*, request_id: str) -> dict[str, Any] | None:
    """One request as the Call wall shows it once finished (with its cost), or None."""
    try:
        pk = uuid.UUID(request_id)
    except ValueError:
        return None
    row = ChatRequest.objects.select_related("model", "api_key", "billing").filter(pk=pk).first()
    return None if row is None else _call_of(row)


def _call_of(row: ChatRequest) -> dict[str, Any]:
    billing: BillingRecord | None = getattr(row, "billing", None)
    call = {
        "request_id": str(row.pk),
        "state": row.status,
        "model": row.model.key,
        "route": row.route_signature or None,
        "mode": row.mode or None,
        "api_key": row.api_key.name,
        "stream": row.stream,
        "api": row.api or None,
        "finish_reason": row.finish_reason or None,
        "error": row.error or None,
        "cost": _money(billing.charge) if billing else None,
        "started_at": row.started_at.timestamp(),
        "finished_at": row.finished_at.timestamp() if row.finished_at else None,
    }
    if billing is not None:
        # A billed request (completed, cancelled by a client that was sent tokens, or
        # partly served) records the token counts it was billed for; a failed one
        # keeps what the console counted.
        call.update(
            prompt_tokens=row.prompt_tokens,
            cached_tokens=row.cached_tokens,
            tokens=row.completion_tokens,
            tokens_per_second=row.tokens_per_second,
        )
    return call


# --- Billing -----------------------------------------------------------------


def billing_summary(*, recent: int = RECENT_BILLS) -> dict[str, Any]:
    """Charges per API key, earnings per node wallet, and the latest billing records."""
    keys = (
        ApiKey.objects.annotate(
            billed=Count("requests__billing"),
            charged=Sum("requests__billing__charge"),
            refunded=Sum("requests__billing__refund__amount"),
            prompt_tokens=Sum("requests__prompt_tokens", filter=Q(requests__billing__isnull=False)),
            completion_tokens=Sum(
                "requests__completion_tokens", filter=Q(requests__billing__isnull=False)
            ),
        )
        .filter(billed__gt=0)
        .order_by("-charged", "name")
    )
    wallets = (
        WorkUnit.objects.values("node__wallet")
        .annotate(
            earned=Sum("amount"),
            units=Sum("units"),
            hops=Count("id"),
            nodes=Count("node", distinct=True),
        )
        .order_by("-earned")
    )
    records = (
        BillingRecord.objects.select_related("request__model", "request__api_key")
        .prefetch_related("work_units")
        .order_by("-created_at")[:recent]
    )
    totals = BillingRecord.objects.aggregate(
        charged=Sum("charge"), fees=Sum("network_fee"), refunded=Sum("refund__amount")
    )
    return {
        "totals": {
            "charged": _money(totals["charged"] or Decimal(0)),
            "network_fees": _money(totals["fees"] or Decimal(0)),
            "refunded": _money(totals["refunded"] or Decimal(0)),
        },
        "api_keys": [
            {
                "name": key.name,
                "prefix": key.prefix,
                "revoked": key.revoked,
                "requests": key.billed,
                "prompt_tokens": key.prompt_tokens or 0,
                "completion_tokens": key.completion_tokens or 0,
                "charged": _money(key.charged or Decimal(0)),
                "refunded": _money(key.refunded or Decimal(0)),
            }
            for key in keys
        ],
        "wallets": [
            {
                "wallet": row["node__wallet"],
                "nodes": row["nodes"],
                "hops": row["hops"],
                "units": row["units"],
                "earned": _money(row["earned"]),
            }
            for row in wallets
        ],
        "records": [_bill_of(record) for record in records],
    }


def _bill_of(record: BillingRecord) -> dict[str, Any]:
    request = record.request
    return {
        "request_id": str(request.pk),
        "created_at": record.created_at.timestamp(),
        "model": request.model.key,
        "api_key": request.api_key.name,
        "api": request.api or None,
        "prompt_tokens": request.prompt_tokens,
        "completion_tokens": request.completion_tokens,
        "charge": _money(record.charge),
        "network_fee": _money(record.network_fee),
        "work_units": [
            {
                "node_id": unit.node_id,
                "start_layer": unit.start_layer,
                "end_layer": unit.end_layer,
                "tokens": unit.tokens,
                "units": unit.units,
                "amount": _money(unit.amount),
            }
            for unit in record.work_units.all()
        ],
    }


def _money(amount: Decimal) -> str:
    # Six places, as stored: JSON has no decimal type and floats would round money.
    return f"{amount:.6f}"
