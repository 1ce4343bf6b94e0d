"""Fixtures for node tests: real node processes (and a real tracker) on free ports."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.checkpoints import tiny_checkpoint, with_other_vocabulary
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


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with the tiny tokenizer: a model, or its draft (ADR-0028)."""
    return tiny_checkpoint("llama", tmp_path_factory.mktemp("draft") / "llama")


@pytest.fixture(scope="module")
def other_vocabulary(llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights under a tokenizer whose ``a`` and ``b`` trade ids."""
    return with_other_vocabulary(
        Path(shutil.copytree(llama, tmp_path_factory.mktemp("draft") / "other"))
    )
