"""The completion pipeline's fixtures: a network of fake heads (tests.support.fake_heads),
and one real tracker with the tiny model split over two nodes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_heads import Net, fake_network
from tests.support.network import Network, start_network
from tests.support.nodes import TINY
from tracker_app.localnet import fresh_process_database


@pytest.fixture
def net() -> Iterator[Net]:
    yield from fake_network()


@pytest.fixture(scope="package")
def tiny_split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """A real tracker and the tiny model split over two nodes (head 0-1, tail 2-3), shared
    by the modules that only send it requests (the official clients' APIs, structured
    output): none of them stops, bans or reconfigures a node, and each finds its own
    requests by their ids."""
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("tiny-split")
        for network in start_network(database_url, tmp, MESHNET_RATE_LIMIT_PER_MINUTE="10000"):
            network.add_node("head", TINY, (0, 1))
            network.add_node("tail", TINY, (2, 3))
            network.wait_for_route(TINY)
            yield network
