"""Reads of the registry that routing needs: the nodes it may use, the models they serve.

The catalogue and topology epochs themselves are read through ``nodes_app.selectors``.
"""

from __future__ import annotations

from collections.abc import Iterable

from nodes_app.models import LanguageModel, Node, NodeStatus
from routing_app.planner import NodeRecord, enumerate_routes


def routing_nodes(*, model: LanguageModel) -> list[NodeRecord]:
    """The model's nodes that take part in routing now: online ones only.

    Draining, offline and banned nodes take no new route.
    """
    rows = Node.objects.filter(model=model, status=NodeStatus.ONLINE).values_list(
        "id",
        "endpoint",
        "shard_start",
        "shard_end",
        "benchmark_tps",
        "measured_tps",
        "queue_depth",
        "active_sessions",
        "reputation",
    )
    return [NodeRecord(*row) for row in rows]


def node_ids_known(*, model: LanguageModel, node_ids: Iterable[str]) -> set[str]:
    """Which of ``node_ids`` the registry holds for ``model``, in any status."""
    return set(Node.objects.filter(model=model, pk__in=list(node_ids)).values_list("id", flat=True))


def language_models_served() -> list[LanguageModel]:
    """Catalogue models whose online nodes form at least one complete route."""
    served = []
    for model in LanguageModel.objects.all():
        nodes = routing_nodes(model=model)
        if nodes and enumerate_routes(
            model_key=model.key, num_layers=model.num_layers, nodes=nodes, limit=1
        ):
            served.append(model)
    return served
