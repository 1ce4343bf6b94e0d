"""Pinned routes: the plan for the node ids a client names in its request (ADR-0003)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from meshnet_site.errors import DomainError, ErrorKind
from routing_app.planning.route_plan import NodeRecord, RoutePlan, plan_from_records


class InvalidPinnedRoute(DomainError):
    """The client pinned a route that cannot serve the model (the message says why)."""

    kind = ErrorKind.INVALID
    code = "invalid_route"


class PinnedNodeUnavailable(DomainError):
    """The client pinned a node of the model that is not online now."""

    kind = ErrorKind.UNAVAILABLE
    code = "route_node_unavailable"


def plan_pinned_route(
    *,
    model_key: str,
    num_layers: int,
    node_ids: Sequence[str],
    online: Mapping[str, NodeRecord],
    known: Iterable[str] = (),
) -> RoutePlan:
    """The plan for a client-pinned list of node ids, or a ``DomainError`` saying why not.

    ``online`` holds the model's online nodes by id; ``known`` the ids of the
    model's nodes in any status (so an offline node raises
    ``PinnedNodeUnavailable``, an id the registry never saw
    ``InvalidPinnedRoute``). Hop 0 must start at layer 0; each later hop runs
    from the previous end + 1 to its own shard end and must hold that layer;
    the last hop must reach the model's last layer.
    """
    if not node_ids:
        raise InvalidPinnedRoute("The pinned route is empty: list at least one node id")
    if len(set(node_ids)) != len(node_ids):
        raise InvalidPinnedRoute("The pinned route lists a node more than once")
    known_ids = set(known) | set(online)
    chain: list[NodeRecord] = []
    for node_id in node_ids:
        node = online.get(node_id)
        if node is None:
            if node_id in known_ids:
                raise PinnedNodeUnavailable(f"Pinned node {node_id} is not online for {model_key}")
            raise InvalidPinnedRoute(f"Pinned node {node_id} is not a node of {model_key}")
        chain.append(node)
    last_layer = num_layers - 1
    start = 0
    for node in chain:
        if start > last_layer:
            raise InvalidPinnedRoute(
                f"Pinned node {node.node_id} comes after the route already reached the "
                f"last layer {last_layer}"
            )
        if not node.shard_start <= start <= node.shard_end:
            raise InvalidPinnedRoute(
                f"Pinned node {node.node_id} holds layers {node.shard_start}-"
                f"{node.shard_end} and cannot run from layer {start}"
            )
        start = min(node.shard_end, last_layer) + 1
    if start - 1 != last_layer:
        raise InvalidPinnedRoute(
            f"The pinned route ends at layer {start - 1}; {model_key} needs layers 0-{last_layer}"
        )
    return plan_from_records(model_key, last_layer, chain)
