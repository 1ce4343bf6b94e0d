"""Routing test fixtures: node records and rows, a manual clock, a fresh store per test."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import pytest
from django.utils import timezone

from nodes_app.models import LanguageModel, Node, NodeStatus, TopologyEpoch
from routing_app.planner import NodeRecord
from routing_app.stats import RouteStatsStore
from routing_app.tracker_store import route_stats_store_install

_counter = itertools.count()


class ManualClock:
    """A clock the test moves by hand: decay without sleeping."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def record(node_id: str, start: int, end: int, tps: float = 100.0, **extra: float) -> NodeRecord:
    """A node record serving layers start..end with benchmark ``tps``."""
    return NodeRecord(
        node_id=node_id,
        endpoint=f"http://{node_id}.test:7000",
        shard_start=start,
        shard_end=end,
        benchmark_tps=tps,
        **extra,  # type: ignore[arg-type]
    )


def make_model(key: str | None = None, num_layers: int = 30) -> LanguageModel:
    model = LanguageModel.objects.create(
        key=key or f"routing-test-{next(_counter)}-{uuid.uuid4().hex[:6]}",
        display_name="routing test model",
        num_layers=num_layers,
        weight_source="builtin:test",
    )
    TopologyEpoch.objects.create(model=model, number=1)
    return model


def make_node(
    model: LanguageModel,
    node_id: str,
    start: int,
    end: int,
    *,
    tps: float = 100.0,
    status: str = NodeStatus.ONLINE,
    **fields: object,
) -> Node:
    now = timezone.now()
    return Node.objects.create(
        id=node_id,
        wallet="ab" * 32,
        endpoint=f"http://{node_id}.test:7000",
        model=model,
        shard_start=start,
        shard_end=end,
        hardware="cpu",
        benchmark_tps=tps,
        status=status,
        token_hash="0" * 64,
        registered_at=now,
        last_heartbeat_at=now,
        **fields,
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> Iterator[RouteStatsStore]:
    """A fresh in-process store, installed as the tracker's store for the test."""
    fresh = RouteStatsStore(half_life=600.0, min_sample_tokens=8, clock=clock)
    previous = route_stats_store_install(fresh)
    yield fresh
    route_stats_store_install(previous)
