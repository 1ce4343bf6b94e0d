"""The routing table of ``GET /v1/routing``: what the tracker learned and will do.

Per model: the topology epoch, how far its requests' speeds stray from their
routes' (the learned sample spread), and every candidate with its hops, prior,
learned tps, coefficient (tps ÷ best proven tps), expected traffic share
under the active policy (with the sessions in flight now), whether a one-off
scout to it is due, sample count, decayed weight and status.

``expected_share`` is where the policy's traffic goes, without a due scout:
a scout takes exactly one request, and showing it as a 100 % share would
hide the split every other request follows (``scout_due`` says it instead).
"""

from __future__ import annotations

from typing import Any

from nodes_app.models import LanguageModel
from nodes_app.selectors import language_model_get, topology_epoch_current
from routing_app.arms import ArmStatus
from routing_app.config import RoutingConfig
from routing_app.load import route_load
from routing_app.services import route_candidates
from routing_app.stats import RouteStatsStore


def routing_table(
    *, model_key: str | None, store: RouteStatsStore, config: RoutingConfig
) -> dict[str, Any]:
    """The table for one model (``ModelNotFound`` if unknown) or for the whole catalogue."""
    if model_key is None:
        models = list(LanguageModel.objects.order_by("key"))
    else:
        models = [language_model_get(key=model_key)]
    return {
        "config": config.to_dict(),
        "models": [_model_table(model, store, config) for model in models],
    }


def _model_table(
    model: LanguageModel, store: RouteStatsStore, config: RoutingConfig
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
    routes = []
    for arm, share, scout in zip(arms, shares, due, strict=True):
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
            }
        )
    spread = store.arms.sample_spread(model.key)
    return {"model": model.key, "epoch": epoch, "sample_spread": spread, "routes": routes}
