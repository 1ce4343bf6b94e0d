"""Background jobs of the node registry."""

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from meshnet_site.outbox.services import outbox_put
from nodes_app.endpoints import EndpointGate
from nodes_app.events import EPOCH, NODE, node_row
from nodes_app.models import Node
from nodes_app.selectors import topology_epoch_current
from nodes_app.services import nodes_sweep_stale
from nodes_app.upkeep import nodes_prune, nodes_reprove


@shared_task(name="nodes.sweep_stale")
def sweep_stale_nodes() -> list[str]:
    """Mark nodes that stopped heartbeating offline and tell the dashboards; their ids."""
    swept = nodes_sweep_stale(
        now=timezone.now(), timeout_seconds=settings.MESHNET_NODE_HEARTBEAT_TIMEOUT
    )
    _announce_offline(swept, reason="liveness sweep")
    return swept


@shared_task(name="nodes.reprove_endpoints")
def reprove_endpoints() -> list[str]:
    """Challenge every online node's endpoint again; the ids of those taken offline."""
    taken = nodes_reprove(gate=EndpointGate(networks=settings.MESHNET_NODE_NETWORKS))
    _announce_offline(taken, reason="endpoint re-proof")
    return taken


@shared_task(name="nodes.prune_stale")
def prune_stale_nodes() -> list[str]:
    """Delete the rows of nodes gone longer than MESHNET_NODE_RETENTION; their ids."""
    return nodes_prune(now=timezone.now(), retention_seconds=settings.MESHNET_NODE_RETENTION)


def _announce_offline(node_ids: list[str], *, reason: str) -> None:
    # A job's own announcement goes out on the worker's channel layer, which
    # reaches no tracker in the embedded mode: the outbox does, in both.
    offline = list(Node.objects.select_related("model").filter(pk__in=node_ids))
    for node in offline:
        outbox_put(kind=NODE, subject=node.pk, payload={"node": node_row(node)})
    # Their models' epochs moved: each tracker rebuilds and pushes the routing table.
    for model in {node.model for node in offline}:
        epoch = topology_epoch_current(model=model)
        outbox_put(
            kind=EPOCH,
            subject=model.key,
            payload={"model": model.key, "epoch": epoch, "reason": reason},
        )
