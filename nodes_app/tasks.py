"""Background jobs of the node registry."""

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from meshnet_site.outbox.services import outbox_put
from nodes_app.models import Node
from nodes_app.services import nodes_sweep_stale

NODE_OFFLINE = "node offline"


@shared_task(name="nodes.sweep_stale")
def sweep_stale_nodes() -> list[str]:
    """Mark nodes that stopped heartbeating offline and tell the dashboards; their ids."""
    swept = nodes_sweep_stale(
        now=timezone.now(), timeout_seconds=settings.MESHNET_NODE_HEARTBEAT_TIMEOUT
    )
    # The worker's channel layer may not reach the trackers (embedded mode):
    # the outbox does, in both modes.
    for node_id, model_key, endpoint in Node.objects.filter(pk__in=swept).values_list(
        "id", "model__key", "endpoint"
    ):
        outbox_put(
            kind=NODE_OFFLINE,
            subject=node_id,
            payload={
                "node_id": node_id,
                "model": model_key,
                "endpoint": endpoint,
                "status": "offline",
            },
        )
    return swept
