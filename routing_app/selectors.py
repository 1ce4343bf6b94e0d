"""Reads of the model catalogue, topology epochs and the nodes that routing may use."""

from __future__ import annotations

from collections.abc import Iterable

from nodes_app.models import Node, NodeStatus
from routing_app.models import LanguageModel, TopologyEpoch
from routing_app.planner import NodeRecord, enumerate_routes


def topology_epoch_current(*, model: LanguageModel) -> int:
    """The model's current topology epoch (0 before any node ever joined)."""
    number = TopologyEpoch.objects.filter(model=model).values_list("number", flat=True).first()
    return number or 0


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


def language_model_get(*, key: str) -> LanguageModel | None:
    return LanguageModel.objects.filter(key=key).first()


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
