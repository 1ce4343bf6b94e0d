"""Fixtures for node tests: real node processes (and a real tracker) on free ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.network import Tracker, running_tracker
from tests.support.nodes import LAYOUTS, TINY, running_nodes
from tracker_app.localnet import NodeProcess, fresh_process_database


@pytest.fixture(scope="module")
def tiny_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, NodeProcess]]:
    """Tiny-model nodes: head 0-1, tail 2-3, whole 0-3, and a partial head 0-2."""
    tmp = tmp_path_factory.mktemp("tiny-nodes")
    with running_nodes(tmp, TINY, LAYOUTS, prefix="tiny", timeout=120) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tracker]:
    """A real tracker process on a database of its own, heartbeats every 0.3 s."""
    tmp = tmp_path_factory.mktemp("tracker")
    with (
        fresh_process_database() as database_url,
        running_tracker(database_url, tmp, MESHNET_NODE_HEARTBEAT_INTERVAL="0.3") as started,
    ):
        yield started
