"""Fixtures shared by every test package: real services, found or started."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from django.conf import settings

from tests.support.network import Network, Tracker, running_tracker, start_network
from tests.support.nodes import SMOLLM2, SMOLLM2_LAYOUTS
from tests.support.redis_server import RedisServer
from tracker_app.localnet import fresh_process_database, process_env
from tracker_app.localnet.stand_in_nodes import ChallengeResponder, challenge_responder
from tracker_app.localnet.warm_start import warm_starter


@pytest.fixture(scope="session", autouse=True)
def warm_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The trackers, workers, nodes and commands the tests start are forked from one
    interpreter that has imported torch and transformers once (ADR-0030)."""
    with warm_starter(process_env(), tmp_path_factory.mktemp("warm-start")):
        yield


@pytest.fixture(scope="session", autouse=True)
def private_channel_layer() -> None:
    """This run's own namespace on the Redis channel layer (before any layer is built).

    CI's Redis is shared: a dashboard consumer under test must not receive
    the updates of a tracker another run (or another checkout) is testing.
    The tracker processes the tests start keep the default namespace; each
    of them watches only its own dashboards.
    """
    config = settings.CHANNEL_LAYERS["default"].get("CONFIG")
    if config is not None:
        config["prefix"] = f"meshnet-test-{os.getpid()}:channels"


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis: REDIS_URL when set (CI), else a private redis-server for this run.

    Tests that use it must namespace their keys (or use a database of their
    own) because CI's Redis is shared with the tracker under test.
    """
    configured = os.environ.get("REDIS_URL")
    if configured:
        yield configured
        return
    if shutil.which("redis-server") is None:
        pytest.fail("these tests need Redis: set REDIS_URL or install redis-server")
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture(scope="session")
def process_database_url() -> Iterator[str]:
    """One process database shared by the tests that only need a tracker to exist."""
    with fresh_process_database() as url:
        yield url


@pytest.fixture(scope="session")
def tracker_process(
    process_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tracker]:
    """A real `runtracker` (daphne) on a free port over the process database.

    One for the run: its tests only read what it serves or measure it around their own
    requests, so none needs a tracker nobody used before (a test that pauses it resumes it).
    """
    with running_tracker(process_database_url, tmp_path_factory.mktemp("tracker")) as tracker:
        yield tracker


@pytest.fixture(scope="session")
def responder() -> Iterator[ChallengeResponder]:
    """A loopback server answering endpoint challenges for the wallets given to it."""
    with challenge_responder() as server:
        yield server


@pytest.fixture(scope="session")
def smollm2_network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """SmolLM2 over a real tracker, for every process test of the real model.

    head 0-14, tail 15-29, whole 0-29 and a partial head 0-21 (ADR-0020's
    topology). Loading the real model in four processes is the suite's
    longest wait, so it is done once. The nodes also serve unsigned plans
    (``--dev-open``) so that node tests can call them directly, without the
    tracker; the tracker's own plans are signed as always.
    """
    tmp = tmp_path_factory.mktemp("smollm2-network")
    with fresh_process_database() as database_url:
        for network in start_network(database_url, tmp):
            for name, layers in SMOLLM2_LAYOUTS.items():
                network.add_node(name, SMOLLM2, layers, extra=("--dev-open",), wait=False)
            network.wait_for_nodes(timeout=240)
            yield network
