"""Background jobs of the node registry."""

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from meshnet_site.outbox.services import outbox_put
from nodes_app.events import NODE, node_row
from nodes_app.models import Node
from nodes_app.services import nodes_sweep_stale


@shared_task(name="nodes.sweep_stale")
def sweep_stale_nodes() -> list[str]:
    """Mark nodes that stopped heartbeating offline and tell the dashboards; their ids."""
    swept = nodes_sweep_stale(
        now=timezone.now(), timeout_seconds=settings.MESHNET_NODE_HEARTBEAT_TIMEOUT
    )
    # The sweep's own announcement goes out on the worker's channel layer,
    # which reaches no tracker in the embedded mode: the outbox does, in both.
    for node in Node.objects.select_related("model").filter(pk__in=swept):
        outbox_put(kind=NODE, subject=node.pk, payload={"node": node_row(node)})
    return swept
