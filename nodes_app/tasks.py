"""Background jobs of the node registry."""

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from meshnet_site.outbox.services import outbox_put
from nodes_app.events import EPOCH, NODE, node_row
from nodes_app.models import Node
from nodes_app.selectors import topology_epoch_current
from nodes_app.services import nodes_sweep_stale


@shared_task(name="nodes.sweep_stale")
def sweep_stale_nodes() -> list[str]:
    """Mark nodes that stopped heartbeating offline and tell the dashboards; their ids."""
    swept = nodes_sweep_stale(
        now=timezone.now(), timeout_seconds=settings.MESHNET_NODE_HEARTBEAT_TIMEOUT
    )
    # The sweep's own announcement goes out on the worker's channel layer,
    # which reaches no tracker in the embedded mode: the outbox does, in both.
    offline = list(Node.objects.select_related("model").filter(pk__in=swept))
    for node in offline:
        outbox_put(kind=NODE, subject=node.pk, payload={"node": node_row(node)})
    # Their models' epochs moved: each tracker rebuilds and pushes the routing table.
    for model in {node.model for node in offline}:
        epoch = topology_epoch_current(model=model)
        outbox_put(
            kind=EPOCH,
            subject=model.key,
            payload={"model": model.key, "epoch": epoch, "reason": "liveness sweep"},
        )
    return swept
