"""GET /v1/models lists exactly the models a complete route can serve."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework import status
from rest_framework.test import APIClient

from nodes_app.models import LanguageModel, Node, NodeStatus

pytestmark = pytest.mark.django_db


def add_node(node_id: str, key: str, start: int, end: int, state: str = NodeStatus.ONLINE) -> None:
    Node.objects.create(
        id=node_id,
        wallet="ef" * 32,
        endpoint=f"http://127.0.0.1/{node_id}",
        model=LanguageModel.objects.get(key=key),
        shard_start=start,
        shard_end=end,
        hardware="cpu",
        benchmark_tps=10.0,
        status=state,
        token_hash="x",
        registered_at=timezone.now(),
        last_heartbeat_at=timezone.now(),
    )


def listed() -> list[str]:
    response = APIClient().get("/v1/models")
    assert response.status_code == status.HTTP_200_OK
    body = response.json()
    assert body["object"] == "list"
    assert all(entry["object"] == "model" for entry in body["data"])
    return [entry["id"] for entry in body["data"]]


def test_no_nodes_means_no_models() -> None:
    assert listed() == []


def test_a_model_is_listed_once_its_online_shards_chain_through_every_layer() -> None:
    add_node("head", "smollm2-135m", 0, 14)
    assert listed() == []

    add_node("tail", "smollm2-135m", 15, 29)
    assert listed() == ["smollm2-135m"]


def test_offline_nodes_do_not_make_a_route() -> None:
    add_node("full", "tiny-random-llama", 0, 3, state=NodeStatus.OFFLINE)

    assert listed() == []
