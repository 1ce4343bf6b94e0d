"""Where a new node should serve (ADR-0019): uncovered layers first, then the weakest stage.

A model's layers fall into *stages*: the stretches between consecutive shard
boundaries of its online nodes, each served by the same set of nodes. A
stage's capacity is the sum of its nodes' unloaded tokens/s (the benchmark,
capped by the measured speed once there is one: ``NodeRecord.effective_tps``
before its load discount), since each node can carry a token through every
layer of its shard. Those numbers are the node's own claims, so they are
floored as routing floors them (SECURITY §9, ``priors.NodeModel.floor``):
once any route of the model is measured, no node is counted faster than the
fastest measured route runs a layer; and a node on no measured route counts
nothing, so a node that only answered the registration challenge and claims
10⁶ tok/s moves no other node (until a request through it is timed). With
nothing measured the claims are all there is.

A new node that holds ``max_layers`` decoder layers is offered:

1. the first range no node serves (``uncovered_layers``), else
2. the stage with the least capacity (ties: fewer nodes, then the earlier stage),

from its first layer, as many of its layers as the node holds. Plain values
in, plain values out: the tracker's view (``routing_app.api``) and
the dashboard read the registry into ``NodeRecord`` values first.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from meshnet_site.errors import DomainError, ErrorKind
from routing_app.learning.arms import ArmView
from routing_app.planning.route_plan import NodeRecord
from routing_app.planning.search import uncovered_layers
from routing_app.policies.priors import TIMED, NodeModel


class NodeTooSmall(DomainError):
    """The node holds no whole layer of the model, so no range can be offered to it."""

    kind = ErrorKind.INVALID
    code = "node_too_small"
    param = "layers"


class PlacementRule(StrEnum):
    """Why a range was offered."""

    UNCOVERED = "uncovered"
    LEAST_CAPACITY = "least_capacity"


@dataclass(frozen=True, slots=True)
class Stage:
    """Layers ``start_layer..end_layer`` (inclusive), served by exactly ``node_ids``."""

    start_layer: int
    end_layer: int
    node_ids: tuple[str, ...]
    capacity_tps: float

    @property
    def num_layers(self) -> int:
        return self.end_layer - self.start_layer + 1


@dataclass(frozen=True, slots=True)
class Offer:
    """The range a new node is given, and why (a sentence for its ready line)."""

    start_layer: int
    end_layer: int
    rule: PlacementRule
    reason: str


@dataclass(frozen=True, slots=True)
class PlacementPlan:
    """A model's stages as its online nodes cover them, and the ranges nobody serves."""

    num_layers: int
    stages: tuple[Stage, ...]
    uncovered: tuple[tuple[int, int], ...]


def node_capacity_tps(node: NodeRecord, layer_seconds_floor: float = 0.0) -> float:
    """What the node can carry when idle: its effective tokens/s without the load discount,
    taking at least ``layer_seconds_floor`` seconds per layer of its shard (0: no floor)."""
    tps = dataclasses.replace(node, queue_depth=0, active_sessions=0).effective_tps
    if layer_seconds_floor > 0:
        layers = node.shard_end - node.shard_start + 1
        tps = min(tps, 1.0 / (layer_seconds_floor * layers))
    return tps


def placement_plan(
    nodes: Sequence[NodeRecord], num_layers: int, arms: Sequence[ArmView] = ()
) -> PlacementPlan:
    """The stages of a model of ``num_layers`` layers served by ``nodes`` (online ones),
    each node's claimed speed floored by the measured routes among ``arms`` as routing
    floors it (``NodeModel.floor``) and a node on none of them counting nothing (no
    measured route: the claims as they are)."""
    if num_layers < 1:
        raise ValueError("a model has at least one layer")
    floor = NodeModel(arms).floor if arms else 0.0
    timed = {
        node_id
        for arm in arms
        if arm.status in TIMED and arm.tps and arm.tps > 0
        for node_id in arm.plan.node_ids
    }
    inside = [
        (node, max(0, node.shard_start), min(num_layers - 1, node.shard_end))
        for node in nodes
        if node.shard_start < num_layers and node.shard_end >= 0
    ]
    cuts = {0, num_layers}
    for _, first, last in inside:
        cuts.update((first, last + 1))
    bounds = sorted(cuts)
    stages = []
    for first, after in itertools.pairwise(bounds):
        serving = [node for node, start, end in inside if start <= first and after - 1 <= end]
        if serving:
            stages.append(
                Stage(
                    start_layer=first,
                    end_layer=after - 1,
                    node_ids=tuple(sorted(node.node_id for node in serving)),
                    capacity_tps=sum(
                        node_capacity_tps(node, floor)
                        for node in serving
                        if floor == 0 or node.node_id in timed
                    ),
                )
            )
    return PlacementPlan(
        num_layers=num_layers,
        stages=tuple(stages),
        uncovered=tuple(uncovered_layers(nodes, num_layers)),
    )


def place(plan: PlacementPlan, *, max_layers: int | None = None) -> Offer:
    """The range a node holding ``max_layers`` decoder layers (None: any number) is offered.

    Raises ``NodeTooSmall`` for a node that holds no whole layer.
    """
    if max_layers is not None and max_layers < 1:
        raise NodeTooSmall(
            "This node's memory holds no whole layer of the model (weights plus its KV "
            "budget): give it more memory (--memory-gb), a smaller --kv-budget, or a "
            "lower precision (--dtype, --quantize)"
        )
    if plan.uncovered:
        first, last = plan.uncovered[0]
        why = f"layers {_span(first, last)} are served by no node"
        rule = PlacementRule.UNCOVERED
    else:
        weakest = min(plan.stages, key=lambda s: (s.capacity_tps, len(s.node_ids), s.start_layer))
        first, last = weakest.start_layer, weakest.end_layer
        nodes = len(weakest.node_ids)
        why = (
            f"every layer is served; stage {_span(first, last)} has the least capacity "
            f"({weakest.capacity_tps:.1f} tok/s over {nodes} node{'s' if nodes != 1 else ''})"
        )
        rule = PlacementRule.LEAST_CAPACITY
    end = last if max_layers is None else min(last, first + max_layers - 1)
    if end < last:
        why += f"; this node holds {max_layers} of its {last - first + 1} layers"
    return Offer(start_layer=first, end_layer=end, rule=rule, reason=why)


def _span(first: int, last: int) -> str:
    return f"{first}-{last}"
