"""Background jobs of the node registry."""

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from nodes_app.services import nodes_sweep_stale


@shared_task(name="nodes.sweep_stale")
def sweep_stale_nodes() -> list[str]:
    """Mark nodes that stopped heartbeating offline; returns their ids."""
    return nodes_sweep_stale(
        now=timezone.now(), timeout_seconds=settings.MESHNET_NODE_HEARTBEAT_TIMEOUT
    )
