"""Bans of failed nodes: back-off that doubles, a cap, quarantine, and a clean slate on success."""

from __future__ import annotations

from typing import Any

from routing_app.exclusions.bans import (
    BAN_BASE_SECONDS,
    BAN_MAX_SECONDS,
    NodeBans,
    node_ban,
    node_bans_clear,
)
from routing_app.learning.stats import RouteStatsStore


def test_each_consecutive_failure_doubles_the_ban_up_to_the_cap() -> None:
    bans = NodeBans()

    seconds = [bans.fail("n") for _ in range(8)]

    assert seconds[:4] == [BAN_BASE_SECONDS * 2**i for i in range(4)]
    assert seconds[-1] == BAN_MAX_SECONDS == 900.0
    assert bans.fail("other") == BAN_BASE_SECONDS


def test_a_ban_quarantines_the_node_for_its_back_off(store: RouteStatsStore, clock: Any) -> None:
    """``store`` and its manual ``clock`` are the routing fixtures."""
    bans = NodeBans()

    assert node_ban(node_id="n", bans=bans) == 30.0
    assert store.exclusions.banned_nodes() == {"n"}
    clock.advance(31)
    assert store.exclusions.banned_nodes() == set()
    assert node_ban(node_id="n", bans=bans) == 60.0
    assert store.exclusions.banned_nodes() == {"n"}


def test_a_success_starts_the_back_off_afresh(store: RouteStatsStore) -> None:
    bans = NodeBans()
    node_ban(node_id="n", bans=bans)
    node_ban(node_id="n", bans=bans)

    node_bans_clear(node_ids=["n", "never-failed"], bans=bans)

    assert bans.failures("n") == 0
    assert node_ban(node_id="n", bans=bans) == BAN_BASE_SECONDS
