"""Bans and quarantines: which candidates are kept out of the choice, and for how long."""

from __future__ import annotations

from routing_app.learning.arms import ArmStatus
from routing_app.learning.stats import RouteStatsStore
from routing_app.learning.sync import StatsSync
from routing_app.planning.route_plan import Hop, RoutePlan

FULL = RoutePlan("m", 29, (Hop("full", "http://full", 0, 29),))
SPLIT = RoutePlan("m", 29, (Hop("a", "http://a", 0, 14), Hop("b", "http://b", 15, 29)))


def sample(store, tps, *, plan=FULL):
    assert store.arms.record_sample(
        model_key=plan.model_key,
        signature=plan.signature,
        epoch=1,
        output_tokens=50,
        tokens_per_second=tps,
    )


def view(store, plan=FULL):
    (arm,) = store.views(plans=[plan], epoch=1)
    return arm


def test_it_quarantines_a_route_for_a_while(store, clock):
    sample(store, 40.0)
    store.exclusions.quarantine_route(model_key="m", signature=FULL.signature, seconds=30.0)

    assert view(store).status is ArmStatus.QUARANTINED
    clock.advance(31.0)
    assert view(store).status is ArmStatus.PROVEN


def test_it_lifts_a_quarantine_on_demand(store):
    store.exclusions.quarantine_route(model_key="m", signature=FULL.signature, seconds=30.0)

    store.exclusions.quarantine_route(model_key="m", signature=FULL.signature, seconds=0)

    assert view(store).status is ArmStatus.UNSAMPLED


def test_it_shows_every_route_through_a_banned_node_as_quarantined(store):
    store.exclusions.ban_node(node_id="b", seconds=30.0)

    statuses = [arm.status for arm in store.views(plans=[FULL, SPLIT], epoch=1)]

    assert statuses == [ArmStatus.UNSAMPLED, ArmStatus.QUARANTINED]
    assert store.exclusions.banned_nodes() == frozenset({"b"})


def test_it_forgets_lapsed_bans_when_syncing(clock):
    store = RouteStatsStore(clock=clock)
    store.exclusions.ban_node(node_id="b", seconds=5.0)
    clock.advance(6.0)

    sync = StatsSync(store)
    sync.sync()

    assert sync.export()["nodes_banned"] == []
