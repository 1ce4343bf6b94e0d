"""The route choice: the active policy picks a candidate for each request.

Two policies (``RoutingConfig.policy``): ``adr0021`` (scout at a fixed share,
exploit P ∝ tps^alpha) and ``thompson-load`` (``routing_app.thompson``,
ADR-0011). What both guarantee is done here, once: quarantined arms are never
chosen, and with no proven arm the best-prior one is taken deterministically
(``greedy-fallback``). ``choose_route`` decides for one request with the
active policy; ``route_shares`` states what that same policy does next (the
``expected_share`` of ``/v1/routing``). Both read the candidates through
``ArmView`` so they can never disagree.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from meshnet_site.errors import DomainError, ErrorKind
from routing_app import thompson
from routing_app.config import POLICY_ADR0021, RoutingConfig
from routing_app.load import NO_LOAD, LoadSnapshot
from routing_app.planner import RoutePlan
from routing_app.stats import ArmStatus, ArmView, RouteStatsStore, least_measured

# What adr0021 scouts: anything not proven under the current topology.
SCOUTABLE = frozenset({ArmStatus.UNSAMPLED, ArmStatus.STALE, ArmStatus.DECAYED})


class DecisionMode(StrEnum):
    SCOUT = "scout"
    EXPLOIT = "exploit"
    PINNED = "pinned"
    GREEDY_FALLBACK = "greedy-fallback"


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The plan to run, how it was chosen, and the topology epoch it was chosen under.

    Record the request's speed against ``epoch`` so a sample measured across
    a topology change never lands on the newer epoch's statistics.
    """

    plan: RoutePlan
    mode: DecisionMode
    epoch: int

    def to_dict(self) -> dict[str, Any]:
        """The chat response's ``meshnet`` field."""
        return {"route": self.plan.signature, "mode": str(self.mode), "hops": self.plan.to_dict()}


class NoRouteAvailable(DomainError):
    """No route can serve the model now; ``reason`` says why (for the client to read)."""

    kind = ErrorKind.UNAVAILABLE
    code = "no_route"

    def __init__(self, model_key: str, reason: str) -> None:
        super().__init__(f"No route can serve {model_key} right now: {reason}")


def _eligible(arms: Sequence[ArmView]) -> list[int]:
    """Indices of the arms that may be chosen (not quarantined), best prior first."""
    return [i for i, arm in enumerate(arms) if arm.status is not ArmStatus.QUARANTINED]


def _exploit_weights(proven: Sequence[ArmView], alpha: float) -> list[float]:
    """tps^alpha, scaled by the fastest arm's so a large alpha cannot overflow."""
    fastest = max((arm.tps or 0.0 for arm in proven), default=0.0)
    if fastest <= 0:
        return [0.0] * len(proven)
    return [(max(arm.tps or 0.0, 0.0) / fastest) ** alpha for arm in proven]


def _adr0021_choose(
    eligible: Sequence[ArmView], config: RoutingConfig, rng: random.Random
) -> tuple[ArmView, DecisionMode]:
    """ADR-0021 among ``eligible`` (some proven): with probability ``explore_share`` the
    least-measured unproven/stale/decayed arm when one exists, else a weighted
    draw among proven arms with P ∝ tps^alpha."""
    proven = [arm for arm in eligible if arm.status is ArmStatus.PROVEN]
    if rng.random() < config.explore_share:
        pool = [i for i, arm in enumerate(eligible) if arm.status in SCOUTABLE]
        target = least_measured(eligible, pool)
        if target is not None:
            return eligible[target], DecisionMode.SCOUT
    weights = _exploit_weights(proven, config.weight_alpha)
    total = sum(weights)
    if total <= 0.0:
        return proven[0], DecisionMode.EXPLOIT
    point = rng.random() * total
    for arm, weight in zip(proven, weights, strict=True):
        point -= weight
        if point < 0.0:
            return arm, DecisionMode.EXPLOIT
    return proven[-1], DecisionMode.EXPLOIT


def _adr0021_shares(eligible: Sequence[ArmView], config: RoutingConfig) -> list[float]:
    """Each of ``eligible``'s (some proven) expected share under ``_adr0021_choose``."""
    shares = [0.0] * len(eligible)
    exploit_share = 1.0
    pool = [i for i, arm in enumerate(eligible) if arm.status in SCOUTABLE]
    target = least_measured(eligible, pool)
    if target is not None and config.explore_share > 0:
        shares[target] = config.explore_share
        exploit_share = 1.0 - config.explore_share
    proven = [i for i, arm in enumerate(eligible) if arm.status is ArmStatus.PROVEN]
    weights = _exploit_weights([eligible[i] for i in proven], config.weight_alpha)
    total = sum(weights)
    for i, weight in zip(proven, weights, strict=True):
        if total > 0:
            shares[i] += exploit_share * weight / total
        elif i == proven[0]:
            shares[i] += exploit_share
    return shares


def policy_choose(
    *,
    arms: Sequence[ArmView],
    config: RoutingConfig,
    rng: random.Random,
    loads: LoadSnapshot = NO_LOAD,
) -> tuple[ArmView, DecisionMode] | None:
    """The active policy's pick among ``arms`` (best prior first); ``None`` when every
    arm is quarantined. With no proven arm: the first eligible one, deterministically."""
    eligible = [arms[i] for i in _eligible(arms)]
    if not eligible:
        return None
    if not any(arm.status is ArmStatus.PROVEN for arm in eligible):
        return eligible[0], DecisionMode.GREEDY_FALLBACK
    if config.policy == POLICY_ADR0021:
        return _adr0021_choose(eligible, config, rng)
    arm, mode = thompson.choose_arm(arms=eligible, loads=loads, config=config, rng=rng)
    return arm, DecisionMode(mode)


def route_shares(
    *,
    arms: Sequence[ArmView],
    config: RoutingConfig,
    loads: LoadSnapshot = NO_LOAD,
    include_scout: bool = True,
) -> list[float]:
    """Each arm's expected share of traffic under the active policy, in the order given.

    ``include_scout=False`` leaves out ``thompson-load``'s one-off scout of a due
    route (``scout_due`` names it) and gives the draw's shares: where traffic
    goes, rather than where the next single request goes. ``adr0021``'s
    scouting is a steady share of traffic and stays either way.
    """
    shares = [0.0] * len(arms)
    eligible = _eligible(arms)
    if not eligible:
        return shares
    views = [arms[i] for i in eligible]
    if not any(arm.status is ArmStatus.PROVEN for arm in views):
        shares[eligible[0]] = 1.0
        return shares
    if config.policy == POLICY_ADR0021:
        ours = _adr0021_shares(views, config)
    else:
        ours = thompson.expected_shares(
            arms=views, loads=loads, config=config, include_scout=include_scout
        )
    for i, share in zip(eligible, ours, strict=True):
        shares[i] = share
    return shares


def scout_due(
    *, arms: Sequence[ArmView], config: RoutingConfig, loads: LoadSnapshot = NO_LOAD
) -> list[bool]:
    """Per arm: whether the next request goes to it for sure, as a one-off scout
    (``thompson-load``: unmeasured, or past the bound, with nothing in flight)."""
    due = [False] * len(arms)
    eligible = _eligible(arms)
    views = [arms[i] for i in eligible]
    if config.policy == POLICY_ADR0021 or not any(a.status is ArmStatus.PROVEN for a in views):
        return due
    target = thompson.scout_target(views, loads, config)
    if target is not None:
        due[eligible[target]] = True
    return due


def choose_route(
    *,
    plans: Sequence[RoutePlan],
    store: RouteStatsStore,
    epoch: int,
    config: RoutingConfig,
    rng: random.Random,
    loads: LoadSnapshot = NO_LOAD,
) -> RouteDecision:
    """Pick one of ``plans`` (best prior first, at least one) for a request.

    ``loads`` are the sessions in flight (the ``thompson-load`` policy weighs
    them). Raises ``NoRouteAvailable`` when every plan is quarantined.
    """
    if not plans:
        raise ValueError("choose_route needs at least one candidate plan")
    picked = policy_choose(
        arms=store.views(plans=plans, epoch=epoch), config=config, rng=rng, loads=loads
    )
    if picked is None:
        raise NoRouteAvailable(plans[0].model_key, "every candidate route is quarantined")
    arm, mode = picked
    return RouteDecision(plan=arm.plan, mode=mode, epoch=epoch)
