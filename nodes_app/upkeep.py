"""Periodic upkeep of the node registry: re-proving endpoints and pruning forgotten rows.

Registration proves an endpoint once; ``nodes_reprove`` proves every online
node's endpoint again (an endpoint can change hands, a name can come to
resolve elsewhere, the allowed networks can narrow), and takes the nodes that
fail offline (and those whose name now reaches another address: their
bans and owner were checked for the old one). ``nodes_prune`` deletes the
rows of nodes gone for longer than the retention, except banned ones (a ban
must outlive its node) and any that billing or audits reference (history
stays whole). ADR-0008.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import ProtectedError, QuerySet

from nodes_app.endpoints import EndpointGate, EndpointNotAllowed, EndpointUnproven
from nodes_app.events import nodes_announce
from nodes_app.models import Node, NodeStatus
from nodes_app.services import nodes_take_offline, topology_epoch_bump

logger = logging.getLogger("meshnet.nodes")

# Challenges run concurrently: one slow endpoint must not hold up the others.
REPROOF_CONCURRENCY = 8


def nodes_reprove(*, gate: EndpointGate) -> list[str]:
    """Challenge every online node's endpoint; take the ones that fail offline.

    Returns the ids taken offline. Each model that lost a node gets one epoch
    bump. A node taken offline comes back only by proving its endpoint again
    (its next heartbeat or registration does).
    """
    online = list(Node.objects.filter(status=NodeStatus.ONLINE).select_related("model"))
    if not online:
        return []

    def proven(node: Node) -> bool:
        try:
            admitted = gate.prove(endpoint=node.endpoint, wallet=node.wallet)
        except (EndpointNotAllowed, EndpointUnproven) as error:
            logger.warning("node %s failed its endpoint re-proof: %s", node.pk, error.message)
            return False
        if node.endpoint_identity and admitted.identity != node.endpoint_identity:
            # The name reaches another socket now: its bans and owner were not checked.
            logger.warning(
                "node %s: endpoint %s now reaches %s, not %s",
                node.pk,
                node.endpoint,
                admitted.identity,
                node.endpoint_identity,
            )
            return False
        return True

    with ThreadPoolExecutor(max_workers=min(REPROOF_CONCURRENCY, len(online))) as pool:
        verdicts = list(pool.map(proven, online))
    taken: list[str] = []
    bumped: set[int] = set()
    for node, ok in zip(online, verdicts, strict=True):
        if ok:
            continue
        with transaction.atomic():
            # Only the row as it was challenged: a node that re-registered
            # elsewhere meanwhile proved its new endpoint.
            same = Node.objects.filter(pk=node.pk, endpoint=node.endpoint, wallet=node.wallet)
            changed, left_routing = nodes_take_offline(same)
            if not changed:
                continue
            taken.append(node.pk)
            if left_routing and node.model_id not in bumped:
                topology_epoch_bump(model=node.model, reason=f"endpoint re-proof: {node.id}")
                bumped.add(node.model_id)
    nodes_announce(taken)
    return taken


def nodes_prune(*, now: datetime, retention_seconds: float) -> list[str]:
    """Delete nodes offline and silent for longer than ``retention_seconds``; their ids.

    Banned nodes are kept (their bans follow wallet and endpoint), and so is
    every node another row still references (its work units, whatever app
    holds them): deleting is for rows nothing remembers.
    """
    cutoff = now - timedelta(seconds=retention_seconds)
    forgotten = _unreferenced(Node.objects.filter(status=NodeStatus.OFFLINE))
    pruned: list[str] = []
    for node_id in forgotten.filter(last_heartbeat_at__lt=cutoff).values_list("pk", flat=True):
        try:
            with transaction.atomic():
                # Conditional: a node that came back, or got a work unit, meanwhile stays.
                still = _unreferenced(
                    Node.objects.filter(
                        pk=node_id, status=NodeStatus.OFFLINE, last_heartbeat_at__lt=cutoff
                    )
                )
                deleted, _ = still.delete()
        except ProtectedError:
            continue
        if deleted:
            pruned.append(node_id)
    return pruned


def _unreferenced(nodes: QuerySet[Node]) -> QuerySet[Node]:
    """``nodes`` that no row of any model points at."""
    for relation in Node._meta.related_objects:
        nodes = nodes.filter(**{f"{relation.name}__isnull": True})
    return nodes
