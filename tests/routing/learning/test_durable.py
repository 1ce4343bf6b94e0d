"""The durable copy of route statistics and the prune job (ADR-0003)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from routing_app.learning.arms import ArmStatus
from routing_app.learning.durable import DatabaseArmArchive
from routing_app.learning.pruning import route_arms_prune
from routing_app.learning.stats import RouteStatsStore
from routing_app.learning.sync import StatsSync
from routing_app.models import PrunedArm, RouteArm, RouteArmSnapshot, RouteQuarantine
from routing_app.planning.route_plan import Hop, RoutePlan
from routing_app.tasks import prune_arms
from tests.support.routing import ManualClock, arm_status, learn

pytestmark = pytest.mark.django_db

FULL = RoutePlan("m", 29, (Hop("full", "http://full", 0, 29),))
SPLIT = RoutePlan("m", 29, (Hop("a", "http://a", 0, 14), Hop("b", "http://b", 15, 29)))
DAY = timedelta(days=1)


class Monotonic:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tracker(name: str, clock: ManualClock, monotonic: Monotonic | None = None) -> StatsSync:
    """Tracker ``name``'s store, synced with the database archive, restored as it starts."""
    archive = DatabaseArmArchive(tracker_id=name, monotonic=monotonic or Monotonic())
    sync = StatsSync(RouteStatsStore(clock=clock), archive=archive)
    sync.restore()
    return sync


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=timezone.now().timestamp())


def test_a_tracker_restarted_under_its_id_routes_on_what_it_had_learned(clock):
    first = tracker("tracker-a:8000", clock)
    learn(first.store, FULL, 40.0, times=1)
    learn(first.store, FULL, 60.0, times=1)
    first.sync()

    restarted = tracker("tracker-a:8000", clock)
    other = tracker("tracker-b:8000", clock)

    (arm,) = restarted.store.views(plans=[FULL], epoch=1)
    assert (arm.status, arm.samples) == (ArmStatus.PROVEN, 2)
    learned = first.store.arms.arm(model_key="m", signature=FULL.signature)
    assert learned is not None
    assert arm.tps == pytest.approx(learned.value)
    assert arm_status(other.store, FULL) is ArmStatus.UNSAMPLED


def test_each_tracker_writes_its_own_arm_row(clock):
    a, b = tracker("a", clock), tracker("b", clock)
    learn(a.store, FULL, 40.0, times=1)
    learn(b.store, FULL, 20.0, times=1)
    a.sync()
    b.sync()
    learn(a.store, FULL, 50.0, times=1)
    a.sync()

    rows = dict(RouteArm.objects.values_list("tracker_id", "samples"))
    assert rows == {"a": 2, "b": 1}


def test_it_snapshots_an_arm_at_most_once_per_interval(clock):
    monotonic = Monotonic()
    sync = tracker("a", clock, monotonic)
    for _ in range(3):
        learn(sync.store, FULL, 40.0, times=1)
        sync.sync()
        monotonic.now += 20.0
    monotonic.now += 60.0
    learn(sync.store, FULL, 40.0, times=1)
    sync.sync()

    assert list(
        RouteArmSnapshot.objects.order_by("taken_at").values_list("samples", flat=True)
    ) == [
        1,
        4,
    ]


def test_the_prune_job_deletes_arms_a_day_without_samples_and_trackers_drop_them(clock):
    sync = tracker("a", clock)
    learn(sync.store, FULL, 40.0, times=1)
    sync.sync()
    clock.advance(23 * 3600.0)
    learn(sync.store, SPLIT, 30.0, times=1)
    sync.sync()

    summary = route_arms_prune(
        now=timezone.now() + timedelta(hours=24, seconds=1),
        ttl=DAY,
        snapshot_retention=timedelta(days=7),
    )
    sync.sync()

    assert summary.arms == 1
    assert list(RouteArm.objects.values_list("signature", flat=True)) == [SPLIT.signature]
    assert arm_status(sync.store, FULL) is ArmStatus.UNSAMPLED
    assert arm_status(sync.store, SPLIT) is ArmStatus.PROVEN


def test_a_pruned_arm_sampled_again_before_the_sync_is_kept(clock):
    sync = tracker("a", clock)
    learn(sync.store, FULL, 40.0, times=1)
    sync.sync()
    route_arms_prune(now=timezone.now() + 2 * DAY, ttl=DAY, snapshot_retention=7 * DAY)
    clock.advance(5.0)
    learn(sync.store, FULL, 45.0, times=1)

    sync.sync()

    assert arm_status(sync.store, FULL) is ArmStatus.PROVEN
    assert RouteArm.objects.filter(signature=FULL.signature).exists()


def test_pruning_twice_deletes_and_records_each_arm_once(clock):
    sync = tracker("a", clock)
    learn(sync.store, FULL, 40.0, times=1)
    sync.sync()
    later = timezone.now() + 2 * DAY

    first = route_arms_prune(now=later, ttl=DAY, snapshot_retention=7 * DAY)
    second = route_arms_prune(now=later, ttl=DAY, snapshot_retention=7 * DAY)

    assert (first.arms, second.arms) == (1, 0)
    assert PrunedArm.objects.count() == 1


def test_the_prune_job_deletes_snapshots_and_records_past_their_retention(clock):
    sync = tracker("a", clock)
    learn(sync.store, FULL, 40.0, times=1)
    sync.sync()
    route_arms_prune(now=timezone.now() + 2 * DAY, ttl=DAY, snapshot_retention=7 * DAY)

    summary = route_arms_prune(now=timezone.now() + 9 * DAY, ttl=DAY, snapshot_retention=7 * DAY)

    assert (summary.snapshots, summary.records) == (1, 1)
    assert not RouteArmSnapshot.objects.exists()


def test_the_prune_task_reads_its_ttl_from_the_settings(clock, settings):
    sync = tracker("a", clock)
    learn(sync.store, FULL, 40.0, times=1)
    sync.sync()
    settings.MESHNET_ROUTE_ARM_TTL = 0.000001

    assert prune_arms() == {"arms": 1, "snapshots": 0, "records": 0}


def test_a_tracker_holds_the_routes_quarantined_in_the_database(clock):
    sync = tracker("a", clock)
    now = timezone.now()
    quarantine = RouteQuarantine.objects.create(
        model_key="m",
        signature=SPLIT.signature,
        corrupt_since=now,
        quarantined_at=now,
        next_probe_at=now,
    )

    sync.sync()
    assert arm_status(sync.store, SPLIT) is ArmStatus.QUARANTINED

    quarantine.released_at = now
    quarantine.save()
    sync.sync()
    assert arm_status(sync.store, SPLIT) is ArmStatus.UNSAMPLED
