"""Routing test fixtures: a manual clock and a fresh route-stats store per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from routing_app.stats import RouteStatsStore
from routing_app.tracker_store import route_stats_store_install
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
