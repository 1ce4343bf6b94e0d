"""Routing test data: node records and rows, models with an epoch, a clock moved by hand,
learned samples, and choices counted in a load book without the registry."""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
from django.utils import timezone

from nodes_app.models import LanguageModel, Node, NodeStatus, TopologyEpoch
from routing_app.learning import tracker_store
from routing_app.learning.arms import ArmStatus
from routing_app.learning.stats import RouteStatsStore
from routing_app.planning.route_plan import NodeRecord, RoutePlan
from routing_app.policies.base import RoutePolicy
from routing_app.policies.choice import RouteDecision
from routing_app.policies.load import LoadSnapshot, RouteLoad

_counter = itertools.count()


@contextmanager
def process_store(store: RouteStatsStore | None) -> Iterator[RouteStatsStore | None]:
    """Make ``store`` the tracker process's route-stats store for a block (``None``: the
    next ``route_stats_store()`` builds one from the settings), then put back the one
    before.

    The store given gets no sync thread: the test syncs it itself (``StatsSync``).
    A sync thread the process had started, or one started inside the block, is
    stopped, so no thread syncs in the background of later tests.
    """
    running = tracker_store._thread
    if running is not None:
        running.stop()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tracker_store, "_store", store)
        patch.setattr(tracker_store, "_thread", None)
        try:
            yield store
        finally:
            started = tracker_store._thread
            if started is not None:
                started.stop()


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
    """A catalogue model (a unique key unless given) at topology epoch 1."""
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
    """A node row serving layers start..end of ``model``, online and just heard from."""
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


def learn(
    store: RouteStatsStore, plan: RoutePlan, tps: float, *, times: int = 3, epoch: int = 1
) -> None:
    """``times`` samples of ``tps`` tokens/s for ``plan`` (model "m"), as completed requests;
    each must be kept."""
    for _ in range(times):
        assert store.arms.record_sample(
            model_key="m",
            signature=plan.signature,
            epoch=epoch,
            output_tokens=64,
            tokens_per_second=tps,
        )


def arm_status(store: RouteStatsStore, plan: RoutePlan, *, epoch: int = 1) -> ArmStatus:
    """``plan``'s status in ``store`` under ``epoch``, as the choice sees it."""
    (arm,) = store.views(plans=[plan], epoch=epoch)
    return arm.status


def choose_counted(
    *,
    plans: Sequence[RoutePlan],
    store: RouteStatsStore,
    policy: RoutePolicy,
    rng: random.Random,
    load: RouteLoad,
    epoch: int = 1,
) -> RouteDecision:
    """``policy``'s choice among ``plans`` with its session opened in ``load`` as one step,
    as ``services.route_choose`` makes it once it has read the registry."""

    def choose(loads: LoadSnapshot) -> RouteDecision:
        picked = policy.choose(store.views(plans=plans, epoch=epoch), rng=rng, loads=loads)
        assert picked is not None, "every candidate is kept out"
        return RouteDecision(plan=picked.arm.plan, mode=picked.mode, epoch=epoch)

    return load.open_chosen(choose)
