"""The node registry's Prometheus series on the tracker's /metrics: each serving node's
prefix-cache figures from its last heartbeat."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from rest_framework import status

from nodes_app.models import LanguageModel, Node, NodeStatus
from tests.support.database_errors import connection_cut
from tests.support.routing import make_node

pytestmark = pytest.mark.django_db

TINY = "tiny-random-llama"


def scraped() -> dict[str, dict[tuple[str, str], float]]:
    """The node series /metrics answers a loopback client: per sample name, by (node, model)."""
    response = Client(REMOTE_ADDR="127.0.0.1").get("/metrics")
    assert response.status_code == status.HTTP_200_OK
    series: dict[str, dict[tuple[str, str], float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            if sample.name.startswith("meshnet_node_"):
                key = (sample.labels["node"], sample.labels["model"])
                series.setdefault(sample.name, {})[key] = sample.value
    return series


def test_metrics_show_each_serving_nodes_prefix_cache_load_and_hits() -> None:
    tiny = LanguageModel.objects.get(key=TINY)
    make_node(tiny, "head", 0, 1, prefix_cache_load=0.25, prefix_hits=12)
    make_node(tiny, "tail", 2, 3, status=NodeStatus.DRAINING, prefix_cache_load=1.0)
    make_node(tiny, "gone", 2, 3, status=NodeStatus.OFFLINE, prefix_cache_load=0.5)

    series = scraped()

    assert series["meshnet_node_prefix_cache_load"] == {("head", TINY): 0.25, ("tail", TINY): 1.0}
    assert series["meshnet_node_prefix_hits_total"] == {("head", TINY): 12, ("tail", TINY): 0}


def test_the_metrics_answer_without_the_node_series_while_the_database_is_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_node(LanguageModel.objects.get(key=TINY), "head", 0, 3, prefix_hits=3)

    def unreachable(*args: object, **kwargs: object) -> None:
        raise connection_cut()

    monkeypatch.setattr(Node.objects, "filter", unreachable)

    assert scraped() == {}
