"""Routing test fixtures: a manual clock, a fresh route-stats store per test and an
empty load book for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from routing_app.learning.stats import RouteStatsStore
from routing_app.learning.tracker_store import route_stats_store_install
from routing_app.policies.load import RouteLoad, route_load_install
from tests.support.routing import ManualClock


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


@pytest.fixture(autouse=True)
def load_book() -> Iterator[RouteLoad]:
    """An empty process-wide load book, so no test sees another's sessions in flight."""
    fresh = RouteLoad()
    previous = route_load_install(fresh)
    yield fresh
    route_load_install(previous)
