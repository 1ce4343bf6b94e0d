"""Registry services the API does not reach: liveness sweep, operator actions, and
registration behind an isolated endpoint gate."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from nodes_app.endpoints import EndpointGate, EndpointUnproven
from nodes_app.models import LanguageModel, Node, NodeStatus
from nodes_app.selectors import topology_epoch_current
from nodes_app.services import (
    Registration,
    node_heartbeat,
    node_register,
    node_set_status,
    nodes_sweep_stale,
)
from tests.support.endpoint_gate import isolated_gate
from tracker_app.localnet.stand_in_nodes import signed_registration

pytestmark = pytest.mark.django_db


def make_node(node_id: str, *, seconds_silent: float, status: str = NodeStatus.ONLINE) -> Node:
    now = timezone.now()
    return Node.objects.create(
        id=node_id,
        wallet="ab" * 32,
        endpoint=f"http://127.0.0.1/{node_id}",
        model=LanguageModel.objects.get(key="tiny-random-llama"),
        shard_start=0,
        shard_end=3,
        hardware="cpu",
        status=status,
        token_hash="x",
        registered_at=now,
        last_heartbeat_at=now - timedelta(seconds=seconds_silent),
    )


def epoch() -> int:
    return topology_epoch_current(model=LanguageModel.objects.get(key="tiny-random-llama"))


def test_the_sweep_marks_silent_nodes_offline_and_bumps_the_epoch_once() -> None:
    make_node("silent-1", seconds_silent=120)
    make_node("silent-2", seconds_silent=90)
    make_node("alive", seconds_silent=2)
    before = epoch()

    swept = nodes_sweep_stale(now=timezone.now(), timeout_seconds=30)

    assert sorted(swept) == ["silent-1", "silent-2"]
    assert Node.objects.get(pk="alive").status == NodeStatus.ONLINE
    assert Node.objects.get(pk="silent-1").status == NodeStatus.OFFLINE
    assert epoch() == before + 1


def test_a_second_sweep_changes_nothing() -> None:
    make_node("silent", seconds_silent=120)
    nodes_sweep_stale(now=timezone.now(), timeout_seconds=30)
    before = epoch()

    assert nodes_sweep_stale(now=timezone.now(), timeout_seconds=30) == []
    assert epoch() == before


def test_a_silent_draining_node_goes_offline_without_a_topology_change() -> None:
    make_node("draining", seconds_silent=120, status=NodeStatus.DRAINING)
    before = epoch()

    assert nodes_sweep_stale(now=timezone.now(), timeout_seconds=30) == ["draining"]
    assert Node.objects.get(pk="draining").status == NodeStatus.OFFLINE
    assert epoch() == before


def test_a_swept_node_that_heartbeats_again_rejoins_with_an_epoch_bump() -> None:
    node = make_node("flaky", seconds_silent=120)
    nodes_sweep_stale(now=timezone.now(), timeout_seconds=30)
    before = epoch()

    node_heartbeat(
        node=node,
        active_sessions=0,
        queue_depth=0,
        measured_tps=0.0,
        prefix_cache_load=0.0,
        prefix_hits=0,
        now=timezone.now(),
        gate=isolated_gate(),
    )

    assert Node.objects.get(pk="flaky").status == NodeStatus.ONLINE
    assert epoch() == before + 1


def test_draining_and_banning_leave_routing_once_and_unbanning_does_not_rejoin() -> None:
    node = make_node("operator", seconds_silent=0)
    before = epoch()

    assert node_set_status(node=node, new_status=NodeStatus.DRAINING)
    assert epoch() == before + 1
    assert node_set_status(node=node, new_status=NodeStatus.BANNED)
    assert epoch() == before + 1  # already out of routing
    assert node_set_status(node=node, new_status=NodeStatus.OFFLINE)
    assert epoch() == before + 1
    assert not node_set_status(node=node, new_status=NodeStatus.OFFLINE)


def register_with(gate: EndpointGate, **overrides: Any) -> Registration:
    """``node_register`` as the API calls it, with ``gate`` in place of the real one."""
    body = signed_registration(**overrides)
    fields = {k: v for k, v in body.items() if k != "signature"}
    return node_register(
        wallet=body["wallet"],
        endpoint=body["endpoint"],
        model_key=body["model"],
        shard_start=body["shard_start"],
        shard_end=body["shard_end"],
        num_layers=body["num_layers"],
        hardware=body["hardware"],
        device_name=body["device_name"],
        benchmark_tps=body["benchmark_tps"],
        timestamp=body["timestamp"],
        signed_fields=fields,
        signature=body["signature"],
        now=timezone.now(),
        max_skew=300.0,
        gate=gate,
        max_benchmark_tps=1e6,
    )


def test_a_node_in_a_public_range_the_setting_allows_registers() -> None:
    gate = isolated_gate(networks=("203.0.113.0/24",))

    registration = register_with(gate, endpoint="http://203.0.113.7:7001/")

    assert registration.node.endpoint == "http://203.0.113.7:7001"
    assert registration.node.status == NodeStatus.ONLINE


def test_a_refused_proof_writes_no_row() -> None:
    gate = isolated_gate(unproven={"http://10.0.0.5:7001"})

    with pytest.raises(EndpointUnproven):
        register_with(gate, endpoint="http://10.0.0.5:7001")
    assert not Node.objects.exists()
