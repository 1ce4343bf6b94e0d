"""StatsSync with an archive: restore, write-back of changed arms, prunes, probe quarantines.

The archive here is a plain in-memory fake (the sync's collaborator, not
the thing under test); the database archive has its own tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from routing_app.learning.arms import TOMBSTONE_SECONDS, ArmKey, ArmState, ArmStatus, PrunedState
from routing_app.learning.stats import RouteStatsStore
from routing_app.learning.sync import ArchiveNews, StatsSync
from routing_app.planning.route_plan import Hop, RoutePlan
from tests.support.routing import ManualClock, arm_status, learn

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


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def test_a_restarted_store_routes_on_the_arms_it_had_written(clock):
    archive = FakeArchive()
    before = StatsSync(RouteStatsStore(clock=clock), archive=archive)
    learn(before.store, FULL, 40.0, times=1)
    before.sync()

    after = StatsSync(RouteStatsStore(clock=clock), archive=archive)
    assert after.restore() == 1

    (arm,) = after.store.views(plans=[FULL], epoch=1)
    assert (arm.status, arm.tps, arm.samples) == (ArmStatus.PROVEN, 40.0, 1)


def test_it_writes_only_the_arms_that_took_samples_since_the_last_sync(clock):
    archive = FakeArchive()
    sync = StatsSync(RouteStatsStore(clock=clock), archive=archive)
    learn(sync.store, FULL, 40.0, times=1)
    learn(sync.store, SPLIT, 20.0, times=1)
    sync.sync()
    learn(sync.store, FULL, 50.0, times=1)

    sync.sync()
    sync.sync()

    assert [sorted(k for k, _ in batch) for batch in archive.written] == [
        sorted([key(FULL), key(SPLIT)]),
        [key(FULL)],
        [],
    ]


def test_it_writes_again_what_a_failed_sync_could_not_write(clock):
    archive = FakeArchive()
    sync = StatsSync(RouteStatsStore(clock=clock), archive=archive)
    learn(sync.store, FULL, 40.0, times=1)
    archive.fail = True

    with pytest.raises(ConnectionError):
        sync.sync()
    archive.fail = False
    sync.sync()

    assert [k for k, _ in archive.written[-1]] == [key(FULL)]


def test_it_drops_an_arm_the_prune_job_deleted(clock):
    archive = FakeArchive()
    sync = StatsSync(RouteStatsStore(clock=clock), archive=archive)
    learn(sync.store, FULL, 40.0, times=1)
    archive.news = ArchiveNews(pruned=[PrunedState(key(FULL), clock.now, own=True)])

    sync.sync()

    assert arm_status(sync.store, FULL) is ArmStatus.UNSAMPLED


def test_it_keeps_an_arm_sampled_after_the_prune_decision(clock):
    archive = FakeArchive()
    sync = StatsSync(RouteStatsStore(clock=clock), archive=archive)
    learn(sync.store, FULL, 40.0, times=1)
    decided_at = clock.now
    clock.advance(10.0)
    learn(sync.store, FULL, 45.0, times=1)
    archive.news = ArchiveNews(pruned=[PrunedState(key(FULL), decided_at, own=True)])

    sync.sync()

    assert arm_status(sync.store, FULL) is ArmStatus.PROVEN


def test_a_peers_pruned_arm_stays_out_while_its_old_publication_lingers(clock):
    sync = StatsSync(RouteStatsStore(clock=clock))
    stale = ArmState(40.0, 1.0, clock.now, 1, 1)
    publication = {"arms": [stale.to_row(key(FULL))]}
    sync.store.arms.absorb([publication["arms"]])
    assert arm_status(sync.store, FULL) is ArmStatus.PROVEN

    sync.store.arms.forget_pruned([PrunedState(key(FULL), clock.now, own=False)])
    sync.store.arms.absorb([publication["arms"]])
    assert arm_status(sync.store, FULL) is ArmStatus.UNSAMPLED

    fresh = ArmState(30.0, 1.0, clock.now + 5.0, 1, 1)
    sync.store.arms.absorb([[fresh.to_row(key(FULL))]])
    assert arm_status(sync.store, FULL) is ArmStatus.PROVEN


def test_a_tombstone_lapses_once_every_peer_has_republished(clock):
    sync = StatsSync(RouteStatsStore(clock=clock))
    sync.store.arms.forget_pruned([PrunedState(key(FULL), clock.now, own=False)])
    clock.advance(TOMBSTONE_SECONDS + 1)
    sync.sync()

    old = ArmState(40.0, 1.0, clock.now - 10_000, 1, 1)
    sync.store.arms.absorb([[old.to_row(key(FULL))]])

    assert arm_status(sync.store, FULL) is not ArmStatus.UNSAMPLED


def test_it_keeps_out_the_routes_the_probe_quarantined_until_they_are_released(clock):
    archive = FakeArchive()
    sync = StatsSync(RouteStatsStore(clock=clock), archive=archive)
    learn(sync.store, SPLIT, 40.0, times=1)
    archive.news = ArchiveNews(quarantined=frozenset({key(SPLIT)}))

    sync.sync()
    clock.advance(3600.0)
    assert arm_status(sync.store, SPLIT) is ArmStatus.QUARANTINED
    assert arm_status(sync.store, FULL) is ArmStatus.UNSAMPLED

    archive.news = ArchiveNews()
    sync.sync()
    assert arm_status(sync.store, SPLIT) is not ArmStatus.QUARANTINED
