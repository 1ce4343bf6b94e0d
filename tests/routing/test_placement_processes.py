"""Placement on a real tracker process: what a hostile catalogue row or node costs it.

The tracker is started once for the module, with no nodes but those a test
adds; ``/api/nodes/placement`` is asked anonymously, as a joining node asks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.network import Network, start_network
from tracker_app.localnet import fresh_process_database

# 2³¹ − 1: what a poisoned config.json declared; the column holds it.
ABSURD_LAYERS = 2**31 - 1


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    with fresh_process_database() as database_url:
        tmp: Path = tmp_path_factory.mktemp("placement")
        yield from start_network(database_url, tmp)


def tracker_rss_mib(network: Network) -> float:
    assert network.tracker is not None
    pid = network.tracker.process.pid
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_a_catalogue_row_of_two_billion_layers_costs_an_anonymous_placement_nothing(
    network: Network,
) -> None:
    # A row written before add_model bounded shapes (add_model refuses it now).
    network.query(
        "INSERT INTO nodes_app_languagemodel (key, display_name, num_layers, weight_source, "
        "prompt_price_per_1k, completion_price_per_1k, chat_template_fault, "
        "prefix_cache_shared, created_at) "
        "VALUES (%s, %s, %s, %s, 0, 0, '', false, CURRENT_TIMESTAMP)",
        "poisoned",
        "poisoned",
        ABSURD_LAYERS,
        "/nowhere",
    )
    before = tracker_rss_mib(network)

    started = time.monotonic()
    answer = httpx.get(
        f"{network.url}/api/nodes/placement", params={"model": "poisoned", "layers": 1}, timeout=30
    )

    assert answer.status_code == 200, answer.text
    assert (answer.json()["start_layer"], answer.json()["end_layer"]) == (0, 0)
    assert time.monotonic() - started < 5
    assert tracker_rss_mib(network) - before < 100
    assert httpx.get(f"{network.url}/healthz", timeout=30).status_code == 200
