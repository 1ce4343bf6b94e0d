"""Routing test fixtures: a manual clock, a fresh route-stats store per test, and an
empty load book and prefix memory for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from routing_app.learning import prefix_memory, route_costs
from routing_app.learning.prefix_memory import PrefixMemory
from routing_app.learning.route_costs import RouteCostBook
from routing_app.learning.stats import RouteStatsStore
from routing_app.policies import load
from routing_app.policies.load import RouteLoad
from tests.support.routing import ManualClock, process_store


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> Iterator[RouteStatsStore]:
    """A fresh in-process store, installed as the tracker's store for the test."""
    fresh = RouteStatsStore(half_life=600.0, min_sample_tokens=8, clock=clock)
    with process_store(fresh):
        yield fresh


@pytest.fixture(autouse=True)
def load_book(monkeypatch: pytest.MonkeyPatch) -> RouteLoad:
    """An empty process-wide load book, so no test sees another's sessions in flight."""
    fresh = RouteLoad()
    monkeypatch.setattr(load, "_route_load", fresh)
    return fresh


@pytest.fixture(autouse=True)
def warm_prefixes(monkeypatch: pytest.MonkeyPatch, clock: ManualClock) -> PrefixMemory:
    """An empty process-wide prefix memory on the test's clock, and an empty book of route
    costs: no test sees another's warm routes or learned costs."""
    fresh = PrefixMemory(clock=clock)
    monkeypatch.setattr(prefix_memory, "_prefix_memory", fresh)
    monkeypatch.setattr(route_costs, "_route_costs", RouteCostBook())
    return fresh
