"""Routing's reads: the nodes it may use, the candidate routes, the table and the placement.

``routing_nodes`` turns the registry's online rows into ``NodeRecord`` values
(the planning stage works on those); ``route_candidates`` is a model's
candidate routes now, read through the process's candidate cache;
``routing_table`` is what ``GET /v1/routing`` and the dashboard show;
``model_placement`` is the placement plan both placement endpoints read. The
catalogue and topology epochs themselves are read through
``nodes_app.selectors``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nodes_app.models import LanguageModel, Node, NodeStatus
from nodes_app.selectors import language_model_get, topology_epoch_current
from routing_app.learning.arms import ArmStatus, ArmView
from routing_app.learning.route_costs import route_costs
from routing_app.learning.stats import RouteStatsStore
from routing_app.learning.tracker_store import route_stats_store
from routing_app.planning.cache import CandidateCache
from routing_app.planning.placement import PlacementPlan, placement_plan
from routing_app.planning.route_plan import NodeRecord, RoutePlan
from routing_app.planning.search import enumerate_routes
from routing_app.policies.config import RoutePolicyConfig
from routing_app.policies.load import route_load

# The process's candidate routes per model and topology (ADR-0018, "The cache").
route_candidate_cache = CandidateCache()


def routing_nodes(*, model: LanguageModel) -> list[NodeRecord]:
    """The model's nodes that take part in routing now: online ones only.

    Draining, offline and banned nodes take no new route.
    """
    rows = Node.objects.filter(model=model, status=NodeStatus.ONLINE).values_list(
        "id",
        "endpoint",
        "shard_start",
        "shard_end",
        "benchmark_tps",
        "measured_tps",
        "queue_depth",
        "active_sessions",
        "reputation",
    )
    return [NodeRecord(*row) for row in rows]


def node_ids_known(*, model: LanguageModel, node_ids: Iterable[str]) -> set[str]:
    """Which of ``node_ids`` the registry holds for ``model``, in any status."""
    return set(Node.objects.filter(model=model, pk__in=list(node_ids)).values_list("id", flat=True))


def language_models_served() -> list[LanguageModel]:
    """Catalogue models whose online nodes form at least one complete route."""
    served = []
    for model in LanguageModel.objects.all():
        nodes = routing_nodes(model=model)
        if nodes and enumerate_routes(
            model_key=model.key, num_layers=model.num_layers, nodes=nodes, limit=1
        ):
            served.append(model)
    return served


def route_candidates(*, model: LanguageModel, store: RouteStatsStore) -> list[RoutePlan]:
    """The model's candidate routes, best prior first.

    Banned nodes take no part in the live candidates (at most ``MAX_CANDIDATES``),
    so the routes go around them; the routes they would have served are appended so
    ``/v1/routing`` shows them as quarantined. Read through ``route_candidate_cache``:
    a node joining, leaving or banned changes them at once.
    """
    nodes = routing_nodes(model=model)
    banned = store.exclusions.banned_nodes()
    plans = route_candidate_cache.routes(
        model_key=model.key, num_layers=model.num_layers, nodes=nodes, avoid=banned
    )
    if banned:
        live = {plan.signature for plan in plans}
        blocked = [
            plan
            for plan in route_candidate_cache.routes(
                model_key=model.key, num_layers=model.num_layers, nodes=nodes
            )
            if banned.intersection(plan.node_ids) and plan.signature not in live
        ]
        plans = sorted(plans + blocked, key=lambda plan: (-plan.prior_tps, len(plan.hops)))
    return plans


def routing_table(
    *, model_key: str | None, store: RouteStatsStore, config: RoutePolicyConfig
) -> dict[str, Any]:
    """The routing table of ``GET /v1/routing``: what the tracker learned and will do, for
    one model (``ModelNotFound`` if unknown) or for the whole catalogue.

    Per model: the topology epoch, how far its requests' speeds stray from their
    routes' (the learned sample spread), and every candidate with its hops, prior,
    learned tps, coefficient (tps ÷ best proven tps), expected traffic share
    under the active policy (with the sessions in flight now), whether a one-off
    scout to it is due, sample count, decayed weight and status, and what a prompt
    token and an answer token cost on it and how far speculation carried its answers
    (``routing_app.learning.route_costs``).

    ``expected_share`` is where the policy's traffic goes, without a due scout:
    a scout takes exactly one request, and showing it as a 100 % share would
    hide the split every other request follows (``scout_due`` says it instead).
    """
    if model_key is None:
        models = list(LanguageModel.objects.order_by("key"))
    else:
        models = [language_model_get(key=model_key)]
    return {
        "config": config.to_dict(),
        "models": [_model_table(model, store, config) for model in models],
    }


def _model_table(
    model: LanguageModel, store: RouteStatsStore, config: RoutePolicyConfig
) -> dict[str, Any]:
    epoch = topology_epoch_current(model=model)
    plans = route_candidates(model=model, store=store)
    arms = store.views(plans=plans, epoch=epoch)
    loads = route_load().snapshot()
    policy = config.route_policy()
    shares = policy.shares(arms, loads=loads, include_scout=False)
    due = policy.scout_due(arms, loads=loads)
    proven = [arm.tps for arm in arms if arm.status is ArmStatus.PROVEN and arm.tps]
    best = max(proven, default=None)
    book = route_costs()
    routes = []
    for arm, share, scout in zip(arms, shares, due, strict=True):
        costs = book.costs(arm.plan)
        routes.append(
            {
                "signature": arm.plan.signature,
                "hops": arm.plan.to_dict(),
                "prior_tps": arm.plan.prior_tps,
                "tps": arm.tps,
                "coefficient": arm.tps / best if best and arm.tps is not None else None,
                "expected_share": share,
                "scout_due": scout,
                "samples": arm.samples,
                "weight": arm.weight,
                "status": str(arm.status),
                "prompt_token_seconds": costs.prompt,
                "answer_token_seconds": costs.answer,
                "drafted_per_token": costs.drafted,
                "accepted_per_token": costs.accepted,
            }
        )
    spread = store.arms.sample_spread(model.key)
    return {"model": model.key, "epoch": epoch, "sample_spread": spread, "routes": routes}


def model_placement(model: LanguageModel) -> PlacementPlan:
    """The model's stages as its online nodes cover them now, their claimed speeds floored
    by the routes this tracker measured (as routing floors them: SECURITY §9)."""
    nodes = routing_nodes(model=model)
    arms: list[ArmView] = []
    if nodes:
        store = route_stats_store()
        plans = route_candidates(model=model, store=store)
        arms = store.views(plans=plans, epoch=topology_epoch_current(model=model))
    return placement_plan(nodes, model.num_layers, arms)
