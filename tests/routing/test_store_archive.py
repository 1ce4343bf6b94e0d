"""RouteStatsStore with an archive: restore, write-back of changed arms, prunes, probe holds.

The archive here is a plain in-memory fake (the store's collaborator, not
the thing under test); the database archive has its own tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from routing_app.planner import Hop, RoutePlan
from routing_app.stats import (
    TOMBSTONE_SECONDS,
    ArchiveNews,
    ArmKey,
    ArmState,
    ArmStatus,
    PrunedState,
    RouteStatsStore,
)
from tests.routing.conftest import ManualClock

FULL = RoutePlan("m", 29, (Hop("full", "http://full", 0, 29),))
SPLIT = RoutePlan("m", 29, (Hop("a", "http://a", 0, 14), Hop("b", "http://b", 15, 29)))


class FakeArchive:
    def __init__(self, stored: list[tuple[ArmKey, ArmState]] | None = None) -> None:
        self.stored = dict(stored or [])
        self.written: list[list[tuple[ArmKey, ArmState]]] = []
        self.news = ArchiveNews()
        self.fail = False

    def restore(self) -> list[tuple[ArmKey, ArmState]]:
        return list(self.stored.items())

    def exchange(self, changed: Sequence[tuple[ArmKey, ArmState]]) -> ArchiveNews:
        if self.fail:
            raise ConnectionError("database away")
        self.written.append(list(changed))
        self.stored.update(changed)
        news, self.news = self.news, ArchiveNews(quarantined=self.news.quarantined)
        return news


def key(plan: RoutePlan) -> ArmKey:
    return (plan.model_key, plan.signature)


def sample(store: RouteStatsStore, tps: float, plan: RoutePlan = FULL) -> None:
    assert store.record_sample(
        model_key=plan.model_key,
        signature=plan.signature,
        epoch=1,
        output_tokens=50,
        tokens_per_second=tps,
    )


def status(store: RouteStatsStore, plan: RoutePlan = FULL) -> ArmStatus:
    (arm,) = store.views(plans=[plan], epoch=1)
    return arm.status


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def test_a_restarted_store_routes_on_the_arms_it_had_written(clock):
    archive = FakeArchive()
    before = RouteStatsStore(clock=clock, archive=archive)
    sample(before, 40.0)
    before.sync()

    after = RouteStatsStore(clock=clock, archive=archive)
    assert after.restore() == 1

    (arm,) = after.views(plans=[FULL], epoch=1)
    assert (arm.status, arm.tps, arm.samples) == (ArmStatus.PROVEN, 40.0, 1)


def test_it_writes_only_the_arms_that_took_samples_since_the_last_sync(clock):
    archive = FakeArchive()
    store = RouteStatsStore(clock=clock, archive=archive)
    sample(store, 40.0, FULL)
    sample(store, 20.0, SPLIT)
    store.sync()
    sample(store, 50.0, FULL)

    store.sync()
    store.sync()

    assert [sorted(k for k, _ in batch) for batch in archive.written] == [
        sorted([key(FULL), key(SPLIT)]),
        [key(FULL)],
        [],
    ]


def test_it_writes_again_what_a_failed_sync_could_not_write(clock):
    archive = FakeArchive()
    store = RouteStatsStore(clock=clock, archive=archive)
    sample(store, 40.0)
    archive.fail = True

    with pytest.raises(ConnectionError):
        store.sync()
    archive.fail = False
    store.sync()

    assert [k for k, _ in archive.written[-1]] == [key(FULL)]


def test_it_drops_an_arm_the_prune_job_deleted(clock):
    archive = FakeArchive()
    store = RouteStatsStore(clock=clock, archive=archive)
    sample(store, 40.0)
    archive.news = ArchiveNews(pruned=[PrunedState(key(FULL), clock.now, own=True)])

    store.sync()

    assert status(store) is ArmStatus.UNSAMPLED


def test_it_keeps_an_arm_sampled_after_the_prune_decision(clock):
    archive = FakeArchive()
    store = RouteStatsStore(clock=clock, archive=archive)
    sample(store, 40.0)
    decided_at = clock.now
    clock.advance(10.0)
    sample(store, 45.0)
    archive.news = ArchiveNews(pruned=[PrunedState(key(FULL), decided_at, own=True)])

    store.sync()

    assert status(store) is ArmStatus.PROVEN


def test_a_peers_pruned_arm_stays_out_while_its_old_publication_lingers(clock):
    store = RouteStatsStore(clock=clock)
    stale = ArmState(40.0, 1.0, clock.now, 1, 1)
    publication = {"arms": [stale.to_row(key(FULL))]}
    store.absorb([publication])
    assert status(store) is ArmStatus.PROVEN

    store.forget_pruned([PrunedState(key(FULL), clock.now, own=False)])
    store.absorb([publication])
    assert status(store) is ArmStatus.UNSAMPLED

    fresh = ArmState(30.0, 1.0, clock.now + 5.0, 1, 1)
    store.absorb([{"arms": [fresh.to_row(key(FULL))]}])
    assert status(store) is ArmStatus.PROVEN


def test_a_tombstone_lapses_once_every_peer_has_republished(clock):
    store = RouteStatsStore(clock=clock)
    store.forget_pruned([PrunedState(key(FULL), clock.now, own=False)])
    clock.advance(TOMBSTONE_SECONDS + 1)
    store.sync()

    store.absorb([{"arms": [ArmState(40.0, 1.0, clock.now - 10_000, 1, 1).to_row(key(FULL))]}])

    assert status(store) is not ArmStatus.UNSAMPLED


def test_it_holds_the_routes_the_probe_quarantined_until_they_are_released(clock):
    archive = FakeArchive()
    store = RouteStatsStore(clock=clock, archive=archive)
    sample(store, 40.0, SPLIT)
    archive.news = ArchiveNews(quarantined=frozenset({key(SPLIT)}))

    store.sync()
    clock.advance(3600.0)
    assert status(store, SPLIT) is ArmStatus.QUARANTINED
    assert status(store, FULL) is ArmStatus.UNSAMPLED

    archive.news = ArchiveNews()
    store.sync()
    assert status(store, SPLIT) is not ArmStatus.QUARANTINED
