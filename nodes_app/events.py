"""What the node registry announces to the dashboards, and the one shape of a node row.

The registry's services call these after a change; each publishes once the
transaction commits (a rolled-back change is never announced). Message
kinds (see ``tracker_app.dashboard.consumer``):

- ``node``: ``{"node": row}``, one node's row after it changed;
- ``epoch``: ``{"model", "epoch", "reason"}``, a model's topology epoch moved.

Heartbeats that change nothing an operator sees but the heartbeat's time
are announced at most every ``HEARTBEAT_ANNOUNCE_SECONDS`` per node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

from django.db import transaction

from meshnet_site.events import publish
from nodes_app.models import Node

NODE = "node"
EPOCH = "epoch"

HEARTBEAT_ANNOUNCE_SECONDS = 5.0

_heartbeats_announced: dict[str, float] = {}
_heartbeats_lock = threading.Lock()


def node_row(node: Node) -> dict[str, Any]:
    """A node as the dashboard shows it: JSON-ready, times as Unix seconds."""
    return {
        "id": node.pk,
        "model": node.model.key,
        "num_layers": node.model.num_layers,
        "wallet": node.wallet,
        "endpoint": node.endpoint,
        "shard_start": node.shard_start,
        "shard_end": node.shard_end,
        "hardware": node.hardware,
        "device_name": node.device_name,
        "precision": node.precision,
        "benchmark_tps": node.benchmark_tps,
        "measured_tps": node.measured_tps,
        "active_sessions": node.active_sessions,
        "queue_depth": node.queue_depth,
        "prefix_cache_load": node.prefix_cache_load,
        "prefix_hits": node.prefix_hits,
        "reputation": node.reputation,
        "status": node.status,
        "registered_at": node.registered_at.timestamp(),
        "last_heartbeat_at": node.last_heartbeat_at.timestamp(),
    }


def nodes_announce(node_ids: Iterable[str]) -> None:
    """Announce these nodes' rows as they are once the current transaction commits."""
    ids = list(node_ids)
    if ids:
        transaction.on_commit(partial(_publish_rows, ids))


def node_heartbeat_announce(node: Node, *, visible_change: bool) -> None:
    """Announce a heartbeat: at once when it changed what the dashboard shows
    (status, sessions, queue, prefix-cache load), else at most every
    ``HEARTBEAT_ANNOUNCE_SECONDS`` (a hit alone waits for that)."""
    now = time.monotonic()
    with _heartbeats_lock:
        last = _heartbeats_announced.get(node.pk)
        if not visible_change and last is not None and now - last < HEARTBEAT_ANNOUNCE_SECONDS:
            return
        _heartbeats_announced[node.pk] = now
    nodes_announce([node.pk])


def epoch_announce(*, model_key: str, epoch: int, reason: str) -> None:
    """Announce a model's new topology epoch once the current transaction commits."""
    payload = {"model": model_key, "epoch": epoch, "reason": reason}
    transaction.on_commit(partial(publish, EPOCH, payload))


def _publish_rows(node_ids: list[str]) -> None:
    for node in Node.objects.select_related("model").filter(pk__in=node_ids):
        publish(NODE, {"node": node_row(node)})
