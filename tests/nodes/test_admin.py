"""The operator's admin pages for nodes, models and epochs."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from nodes_app.models import LanguageModel, Node, NodeStatus
from nodes_app.selectors import topology_epoch_current

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client() -> Client:
    user = User.objects.create_superuser("operator", password="pw-for-tests")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def node() -> Node:
    now = timezone.now()
    return Node.objects.create(
        id="abcdef01-0123456789ab",
        wallet="ab" * 32,
        endpoint="http://10.0.0.5:7001",
        model=LanguageModel.objects.get(key="smollm2-135m"),
        shard_start=0,
        shard_end=14,
        hardware="cuda",
        device_name="RTX 4060",
        token_hash="x",
        registered_at=now,
        last_heartbeat_at=now,
    )


def test_the_node_list_shows_shard_status_and_hardware(staff_client: Client, node: Node) -> None:
    page = staff_client.get("/admin/nodes_app/node/").content.decode()

    assert node.id in page
    assert "0-14" in page
    assert "RTX 4060" in page
    assert "online" in page.lower()


def test_the_catalogue_and_epochs_are_listed(staff_client: Client) -> None:
    models = staff_client.get("/admin/nodes_app/languagemodel/").content.decode()
    epochs = staff_client.get("/admin/nodes_app/topologyepoch/").content.decode()

    assert "smollm2-135m" in models and "tiny-random-llama" in models
    assert "smollm2-135m" in epochs


def test_the_drain_action_takes_the_node_out_of_routing(staff_client: Client, node: Node) -> None:
    before = topology_epoch_current(model=node.model)

    response = staff_client.post(
        "/admin/nodes_app/node/",
        {"action": "drain", "_selected_action": [node.id]},
        follow=True,
    )

    assert "Drained 1 node(s)." in response.content.decode()
    node.refresh_from_db()
    assert node.status == NodeStatus.DRAINING
    assert topology_epoch_current(model=node.model) == before + 1


def test_ban_then_unban_leaves_the_node_offline(staff_client: Client, node: Node) -> None:
    for action in ("ban", "unban"):
        staff_client.post(
            "/admin/nodes_app/node/", {"action": action, "_selected_action": [node.id]}
        )

    node.refresh_from_db()
    assert node.status == NodeStatus.OFFLINE


def test_anonymous_visitors_are_sent_to_log_in(node: Node) -> None:
    response = Client().get("/admin/nodes_app/node/")

    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
