"""The registry's periodic upkeep in process: endpoint re-proof and pruning forgotten rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from nodes_app.endpoints import EndpointUnproven
from nodes_app.models import LanguageModel, Node, NodeStatus
from nodes_app.selectors import topology_epoch_current
from nodes_app.services import node_heartbeat
from nodes_app.upkeep import nodes_prune, nodes_reprove
from tests.support.dashboard import api_key, completed_request, make_node
from tests.support.endpoint_gate import isolated_gate

pytestmark = pytest.mark.django_db

WEEK = 7 * 24 * 3600.0


def epoch() -> int:
    return topology_epoch_current(model=LanguageModel.objects.get(key="tiny-random-llama"))


def status(node_id: str) -> str:
    return str(Node.objects.get(pk=node_id).status)


def test_the_re_proof_takes_nodes_that_fail_offline_with_one_epoch_bump() -> None:
    make_node("honest", 0, 3)
    make_node("gone-1", 0, 3)
    make_node("gone-2", 0, 1)
    before = epoch()
    gate = isolated_gate(unproven={"http://gone-1.test:7000", "http://gone-2.test:7000"})

    taken = nodes_reprove(gate=gate)

    assert sorted(taken) == ["gone-1", "gone-2"]
    assert (status("honest"), status("gone-1"), status("gone-2")) == (
        "online",
        "offline",
        "offline",
    )
    assert epoch() == before + 1
    assert "endpoint re-proof" in LanguageModel.objects.get(key="tiny-random-llama").epoch.reason


def test_the_re_proof_also_applies_a_narrowed_network_policy() -> None:
    make_node("lan", 0, 3)

    assert nodes_reprove(gate=isolated_gate(networks=("192.168.0.0/16",))) == ["lan"]


def test_a_node_taken_offline_comes_back_by_heartbeat_only_once_it_proves_again() -> None:
    node = make_node("flaky", 0, 3)
    failing = isolated_gate(unproven={"http://flaky.test:7000"})
    nodes_reprove(gate=failing)
    offline = Node.objects.select_related("model").get(pk=node.pk)

    with pytest.raises(EndpointUnproven):
        node_heartbeat(
            node=offline, active_sessions=0, queue_depth=0, measured_tps=1.0,
            prefix_cache_load=0.0, prefix_hits=0, now=timezone.now(), gate=failing,
        )  # fmt: skip
    assert status("flaky") == "offline"

    node_heartbeat(
        node=offline, active_sessions=0, queue_depth=0, measured_tps=1.0,
        prefix_cache_load=0.0, prefix_hits=0, now=timezone.now(), gate=isolated_gate(),
    )  # fmt: skip
    assert status("flaky") == "online"


def test_pruning_deletes_only_long_gone_rows_nothing_references() -> None:
    make_node("forgotten", 0, 3, status=NodeStatus.OFFLINE, seconds_silent=WEEK + 60)
    make_node("recent", 0, 3, status=NodeStatus.OFFLINE, seconds_silent=3600)
    make_node("banned", 0, 3, status=NodeStatus.BANNED, seconds_silent=WEEK + 60)
    make_node("silent-online", 0, 3, seconds_silent=WEEK + 60)
    billed = make_node("billed", 0, 3)
    completed_request(key=api_key(), hops=[billed])
    Node.objects.filter(pk="billed").update(
        status=NodeStatus.OFFLINE, last_heartbeat_at=timezone.now() - timedelta(days=30)
    )

    pruned = nodes_prune(now=timezone.now(), retention_seconds=WEEK)

    assert pruned == ["forgotten"]
    assert sorted(Node.objects.values_list("pk", flat=True)) == [
        "banned",
        "billed",
        "recent",
        "silent-online",
    ]
    assert nodes_prune(now=timezone.now(), retention_seconds=WEEK) == []
