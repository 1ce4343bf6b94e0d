"""Pinned routes: the plan for the node ids a client names, or why it cannot be one."""

from __future__ import annotations

import pytest
from rest_framework import status

from meshnet_site.errors import http_error
from routing_app.planning.pinned import InvalidPinnedRoute, PinnedNodeUnavailable, plan_pinned_route
from tests.support.routing import record

MIXED = [record("gpu-abc", 0, 21, tps=11164.0), record("cpu-def", 0, 39, tps=425.0)]


def pin(node_ids, nodes=MIXED, known=()):
    return plan_pinned_route(
        model_key="qwen",
        num_layers=40,
        node_ids=node_ids,
        online={node.node_id: node for node in nodes},
        known=known,
    )


def test_it_plans_a_pinned_hybrid_route_from_layer_22_on_the_full_node():
    plan = pin(["gpu-abc", "cpu-def"])

    assert plan.signature == "qwen | gpu-abc[0-21] -> cpu-def[22-39]"
    assert plan.prior_tps == 425.0


@pytest.mark.parametrize(
    ("node_ids", "message"),
    [
        ([], "empty"),
        (["cpu-def", "cpu-def"], "more than once"),
        (["gpu-abc"], "ends at layer 21"),
        (["gpu-abc", "cpu-def", "gpu-abc"], "more than once"),
        (["cpu-def", "gpu-abc"], "already reached the last layer"),
        (["nobody"], "not a node of qwen"),
    ],
)
def test_it_rejects_an_invalid_pinned_route_with_a_400(node_ids, message):
    with pytest.raises(InvalidPinnedRoute, match=message) as caught:
        pin(node_ids)

    assert http_error(caught.value).status == status.HTTP_400_BAD_REQUEST
    assert caught.value.code == "invalid_route"


def test_it_rejects_a_pinned_hop_that_does_not_hold_the_next_layer():
    nodes = [record("a", 0, 9), record("b", 12, 29)]

    with pytest.raises(InvalidPinnedRoute, match="holds layers 12-29 and cannot run from layer 10"):
        plan_pinned_route(
            model_key="qwen",
            num_layers=30,
            node_ids=["a", "b"],
            online={n.node_id: n for n in nodes},
        )


def test_it_answers_503_for_a_pinned_node_that_is_not_online():
    with pytest.raises(PinnedNodeUnavailable, match="not online") as caught:
        pin(["gone"], known=["gone"])

    assert http_error(caught.value).status == status.HTTP_503_SERVICE_UNAVAILABLE
