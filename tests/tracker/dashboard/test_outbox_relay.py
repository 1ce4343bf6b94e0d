"""The outbox: background jobs' dashboard events reach the tracker's channel layer."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from meshnet_site.events import DASHBOARD_GROUP
from meshnet_site.outbox.models import OutboxMessage
from meshnet_site.outbox.services import STALE_AFTER, outbox_claim, outbox_put
from nodes_app.events import EPOCH, NODE
from nodes_app.models import Node, NodeStatus
from nodes_app.selectors import topology_epoch_current
from nodes_app.tasks import sweep_stale_nodes
from tests.support.routing import make_model, make_node
from tracker_app.dashboard.outbox_relay import outbox_relay_once

pytestmark = pytest.mark.django_db


def test_a_claimed_message_is_gone_so_it_is_forwarded_once():
    outbox_put(kind="refund", subject="r1", payload={"amount": "0.1"})
    outbox_put(kind="refund", subject="r2")

    first = outbox_claim(now=timezone.now())
    second = outbox_claim(now=timezone.now())

    assert [m.subject for m in first] == ["r1", "r2"]
    assert second == []


def test_a_message_nobody_forwarded_in_time_is_dropped():
    outbox_put(kind="refund", subject="old")

    assert outbox_claim(now=timezone.now() + STALE_AFTER + timedelta(seconds=1)) == []
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db(transaction=True)  # the relay's database calls run in a thread
def test_the_relay_pushes_each_message_to_the_dashboard_group():
    async def listen_and_relay():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(DASHBOARD_GROUP, channel)
        forwarded = await outbox_relay_once()
        event = await layer.receive(channel)
        await layer.group_discard(DASHBOARD_GROUP, channel)
        return forwarded, event

    outbox_put(kind="refund", subject="r1", payload={"request_id": "r1", "amount": "0.1"})

    forwarded, message = async_to_sync(listen_and_relay)()

    assert forwarded == 1
    assert (message["kind"], message["payload"]) == (
        "refund",
        {"request_id": "r1", "amount": "0.1"},
    )


def test_the_sweep_tells_the_dashboards_of_each_node_it_took_offline(settings):
    settings.MESHNET_NODE_HEARTBEAT_TIMEOUT = 30.0
    model = make_model(num_layers=4)
    make_node(model, "silent", 0, 3)
    make_node(model, "alive", 0, 3)
    Node.objects.filter(pk="silent").update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))

    assert sweep_stale_nodes() == ["silent"]

    assert Node.objects.get(pk="silent").status == NodeStatus.OFFLINE
    node, epoch = OutboxMessage.objects.order_by("id")
    assert (node.kind, node.payload["node"]["id"], node.payload["node"]["status"]) == (
        NODE,
        "silent",
        "offline",
    )
    # The model's epoch moved: every tracker rebuilds its routing table for the dashboards.
    assert (epoch.kind, epoch.payload["model"], epoch.payload["epoch"]) == (
        EPOCH,
        model.key,
        topology_epoch_current(model=model),
    )
