"""Several trackers, one picture: stores merged through a real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.test import override_settings

from routing_app.learning.arms import ArmStatus
from routing_app.learning.prefix_memory import PrefixMemory, RequestPrefix
from routing_app.learning.redis_merge import RedisArmExchange
from routing_app.learning.stats import RouteStatsStore
from routing_app.learning.sync import StatsSync
from routing_app.learning.tracker_store import StatsSyncThread, stats_sync_from_settings
from routing_app.planning.route_plan import Hop, RoutePlan
from tests.support.routing import ManualClock

SIG = "m | full[0-29]"


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_url)
    yield connection
    connection.close()


@pytest.fixture
def prefix(client: redis.Redis) -> Iterator[str]:
    """A namespace of this test's own: CI's Redis is shared."""
    name = f"test:routestats:{uuid.uuid4().hex}"
    yield name
    keys = list(client.scan_iter(f"{name}:*"))
    if keys:
        client.delete(*keys)


def tracker(client, prefix, clock, ttl=60.0) -> StatsSync:
    """One tracker's store, synced through Redis under ``prefix``."""
    exchange = RedisArmExchange(client=client, prefix=prefix, ttl=ttl)
    return StatsSync(RouteStatsStore(half_life=600.0, clock=clock), exchange=exchange)


def sample(sync, tps, *, epoch=1, signature=SIG):
    assert sync.store.arms.record_sample(
        model_key="m", signature=signature, epoch=epoch, output_tokens=32, tokens_per_second=tps
    )


def test_it_sees_the_samples_another_tracker_recorded(client, prefix):
    clock = ManualClock()
    first, second = tracker(client, prefix, clock), tracker(client, prefix, clock)
    for _ in range(3):
        sample(first, 60.0)

    first.sync()
    second.sync()

    arm = second.store.arms.arm(model_key="m", signature=SIG)
    assert arm is not None
    assert (arm.value, arm.mass, arm.samples) == (60.0, 3.0, 3)


def test_it_merges_both_trackers_samples_by_decayed_weight(client, prefix):
    clock = ManualClock()
    first, second = tracker(client, prefix, clock), tracker(client, prefix, clock)
    sample(first, 100.0)
    clock.advance(600.0)
    sample(second, 200.0)

    for sync in (first, second, first):
        sync.sync()

    expected = (0.5 * 100.0 + 1.0 * 200.0) / 1.5
    for sync in (first, second):
        arm = sync.store.arms.arm(model_key="m", signature=SIG)
        assert arm is not None
        assert arm.value == pytest.approx(expected)
        assert (arm.mass, arm.samples) == (pytest.approx(1.5), 2)


def test_it_never_counts_its_own_samples_twice(client, prefix):
    clock = ManualClock()
    first, second = tracker(client, prefix, clock), tracker(client, prefix, clock)
    sample(first, 50.0)

    for _ in range(3):
        first.sync()
        second.sync()

    for sync in (first, second):
        arm = sync.store.arms.arm(model_key="m", signature=SIG)
        assert arm is not None
        assert (arm.mass, arm.samples) == (1.0, 1)


def test_it_shows_a_peers_arm_with_the_status_it_has_locally(client, prefix):
    clock = ManualClock()
    first, second = tracker(client, prefix, clock), tracker(client, prefix, clock)
    sample(first, 50.0, epoch=3)
    first.sync()
    second.sync()

    plan = RoutePlan("m", 29, (Hop("full", "http://full", 0, 29),))

    assert second.store.views(plans=[plan], epoch=3)[0].status is ArmStatus.PROVEN
    assert second.store.views(plans=[plan], epoch=4)[0].status is ArmStatus.STALE


def test_it_lets_a_peers_newer_epoch_supersede_local_stale_stats(client, prefix):
    clock = ManualClock()
    first, second = tracker(client, prefix, clock), tracker(client, prefix, clock)
    for _ in range(5):
        sample(first, 90.0, epoch=1)
    sample(second, 30.0, epoch=2)

    second.sync()
    first.sync()

    arm = first.store.arms.arm(model_key="m", signature=SIG)
    assert arm is not None
    assert (arm.value, arm.epoch, arm.samples) == (30.0, 2, 1)


def test_it_drops_a_peer_that_stopped_publishing(client, prefix):
    clock = ManualClock()
    quitter = tracker(client, prefix, clock, ttl=0.3)
    survivor = tracker(client, prefix, clock)
    sample(quitter, 60.0)
    quitter.sync()

    time.sleep(0.5)
    survivor.sync()

    assert survivor.store.arms.arm(model_key="m", signature=SIG) is None


def test_it_forgets_a_withdrawn_peer_at_the_next_sync(client, prefix):
    clock = ManualClock()
    leaving, staying = tracker(client, prefix, clock), tracker(client, prefix, clock)
    sample(leaving, 60.0)
    leaving.sync()
    staying.sync()

    assert isinstance(leaving.exchange, RedisArmExchange)
    # The peer withdraws: its publication and its place in the list of live ones go.
    client.delete(f"{prefix}:proc:{leaving.exchange.process_id}")
    client.zrem(f"{prefix}:procs", leaving.exchange.process_id)
    staying.sync()

    assert staying.store.arms.arm(model_key="m", signature=SIG) is None


def test_it_shares_quarantines_between_trackers(client, prefix):
    clock = ManualClock()
    first, second = tracker(client, prefix, clock), tracker(client, prefix, clock)
    first.store.exclusions.ban_node(node_id="bad-node", seconds=120.0)
    first.store.exclusions.quarantine_route(model_key="m", signature=SIG, seconds=120.0)

    first.sync()
    second.sync()

    assert second.store.exclusions.banned_nodes() == frozenset({"bad-node"})
    clock.advance(121.0)
    assert second.store.exclusions.banned_nodes() == frozenset()


def test_a_conversation_is_warm_on_its_route_for_every_tracker(client, prefix):
    """What one tracker's route served, its peers know at their next sync (ADR-0029)."""
    clock = ManualClock()
    first, second = (
        StatsSync(
            RouteStatsStore(half_life=600.0, clock=clock),
            exchange=RedisArmExchange(client=client, prefix=prefix),
            prefixes=PrefixMemory(clock=clock),
        )
        for _ in range(2)
    )
    plan = RoutePlan("m", 29, (Hop("full", "http://full", 0, 29),))
    turn = RequestPrefix(tuple(f"b{i}" for i in range(8)), prompt_tokens=300, output_tokens=9)
    assert first.prefixes is not None and second.prefixes is not None
    first.prefixes.served(plan=plan, blocks=turn.blocks)

    first.sync()
    second.sync()

    assert second.prefixes.held(plan, turn) == 8


def test_it_keeps_each_namespace_to_itself(client, prefix):
    clock = ManualClock()
    here = tracker(client, prefix, clock)
    elsewhere = tracker(client, f"{prefix}:other", clock)
    sample(elsewhere, 60.0)

    elsewhere.sync()
    here.sync()

    assert here.store.arms.arm(model_key="m", signature=SIG) is None


def test_it_syncs_in_the_background_until_stopped(client, prefix):
    clock = ManualClock()
    first, second = tracker(client, prefix, clock), tracker(client, prefix, clock)
    threads = [StatsSyncThread(first, 0.02), StatsSyncThread(second, 0.02)]
    for thread in threads:
        thread.start()
    try:
        sample(first, 70.0)
        deadline = time.monotonic() + 5.0
        while second.store.arms.arm(model_key="m", signature=SIG) is None:
            assert time.monotonic() < deadline, "the peer's arm never arrived"
            time.sleep(0.02)
    finally:
        for thread in threads:
            thread.stop()
            thread.join(timeout=2.0)

    arm = second.store.arms.arm(model_key="m", signature=SIG)
    assert arm is not None
    assert arm.value == 70.0


def test_it_wires_the_process_store_to_redis_only_when_redis_is_configured(redis_url):
    with override_settings(REDIS_URL=None):
        sync = stats_sync_from_settings()
        assert sync is not None and sync.exchange is None
    with override_settings(REDIS_URL=redis_url):
        sync = stats_sync_from_settings()
        assert sync is not None and isinstance(sync.exchange, RedisArmExchange)


def test_it_keeps_routing_on_local_statistics_without_redis():
    clock = ManualClock()
    alone = StatsSync(RouteStatsStore(clock=clock))
    sample(alone, 45.0)

    alone.sync()

    arm = alone.store.arms.arm(model_key="m", signature=SIG)
    assert arm is not None
    assert arm.value == 45.0


def test_it_syncs_from_an_asyncio_loop_without_blocking_it(client, prefix):
    clock = ManualClock()
    first, second = tracker(client, prefix, clock), tracker(client, prefix, clock)
    sample(first, 80.0)

    async def both() -> None:
        await first.sync_async()
        await second.sync_async()

    asyncio.run(both())

    arm = second.store.arms.arm(model_key="m", signature=SIG)
    assert arm is not None
    assert arm.value == 80.0
