"""Routing's reads of the registry: the nodes routing may use, and the candidate routes
they form now (banned nodes routed around, their routes listed as quarantined)."""

from __future__ import annotations

import random

import pytest

from nodes_app.models import NodeStatus
from routing_app.policies.choice import NoRouteAvailable
from routing_app.selectors import route_candidates, routing_nodes
from routing_app.services import route_choose
from tests.support.routing import make_model, make_node


@pytest.mark.django_db
def test_it_routes_only_over_online_nodes():
    model = make_model(num_layers=30)
    make_node(model, "online", 0, 29)
    for state in (NodeStatus.OFFLINE, NodeStatus.DRAINING, NodeStatus.BANNED):
        make_node(model, f"node-{state}", 0, 29, tps=1000.0, status=state)

    assert [node.node_id for node in routing_nodes(model=model)] == ["online"]


@pytest.mark.django_db
def test_it_lists_quarantined_routes_after_routing_around_the_held_node(store):
    model = make_model(num_layers=30)
    make_node(model, "head", 0, 9)
    make_node(model, "fast", 10, 29, tps=900.0)
    make_node(model, "slow", 5, 29, tps=50.0)
    store.exclusions.ban_node(node_id="fast", seconds=60)

    plans = route_candidates(model=model, store=store)

    assert [plan.node_ids for plan in plans] == [("head", "fast"), ("head", "slow")]
    views = store.views(plans=plans, epoch=1)
    assert [str(view.status) for view in views] == ["quarantined", "unsampled"]


@pytest.mark.django_db
def test_a_node_gone_offline_or_banned_leaves_the_live_candidates_at_once(store):
    model = make_model(num_layers=30)
    make_node(model, "head", 0, 9)
    fast = make_node(model, "fast", 10, 29, tps=900.0)
    make_node(model, "slow", 10, 29, tps=50.0)
    assert [plan.node_ids for plan in route_candidates(model=model, store=store)] == [
        ("head", "fast"),
        ("head", "slow"),
    ]

    fast.status = NodeStatus.OFFLINE
    fast.save(update_fields=["status"])
    gone = route_candidates(model=model, store=store)
    chosen = route_choose(model=model, rng=random.Random(1))
    store.exclusions.ban_node(node_id="slow", seconds=60)

    assert [plan.node_ids for plan in gone] == [("head", "slow")]
    assert chosen.plan.node_ids == ("head", "slow")
    with pytest.raises(NoRouteAvailable):
        route_choose(model=model, rng=random.Random(1))
