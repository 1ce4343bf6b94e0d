"""The route choice: the active policy picks a candidate for each request.

Two policies (``RoutingConfig.policy``): ``adr0021`` (``choose_arm``: scout,
exploit P ∝ tps^alpha, or fall back to the best prior) and ``thompson-load``
(``routing_app.thompson``, ADR-0011). ``choose_route`` decides for one
request with the active one; ``route_shares`` states what that same policy
does next (the ``expected_share`` of ``/v1/routing``). Both read the
candidates through ``ArmView`` so they can never disagree.
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
from routing_app.stats import ArmStatus, ArmView, RouteStatsStore

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


def _scout_target(arms: Sequence[ArmView]) -> int | None:
    """Index of the least-measured scoutable arm under the current topology.

    Ties go to the higher prior, then to the earlier arm.
    """
    pool = [i for i, arm in enumerate(arms) if arm.status in SCOUTABLE]
    if not pool:
        return None
    return min(pool, key=lambda i: (arms[i].current_weight, -arms[i].plan.prior_tps, i))


def _exploit_weights(proven: Sequence[ArmView], alpha: float) -> list[float]:
    """tps^alpha, scaled by the fastest arm's so a large alpha cannot overflow."""
    fastest = max((arm.tps or 0.0 for arm in proven), default=0.0)
    if fastest <= 0:
        return [0.0] * len(proven)
    return [(max(arm.tps or 0.0, 0.0) / fastest) ** alpha for arm in proven]


def choose_arm(
    *, arms: Sequence[ArmView], config: RoutingConfig, rng: random.Random
) -> tuple[ArmView, DecisionMode] | None:
    """The ADR-0021 policy (``adr0021``) over ``arms`` (best prior first); ``None`` when
    every arm is held.

    With no proven arm: the first (best-prior) arm that is not quarantined,
    deterministically. Otherwise with probability ``explore_share`` the
    least-measured unproven/stale/decayed arm when one exists, else a
    weighted draw among proven arms with P ∝ tps^alpha.
    """
    eligible = [arm for arm in arms if arm.status is not ArmStatus.QUARANTINED]
    if not eligible:
        return None
    proven = [arm for arm in eligible if arm.status is ArmStatus.PROVEN]
    if not proven:
        return eligible[0], DecisionMode.GREEDY_FALLBACK
    if rng.random() < config.explore_share:
        target = _scout_target(eligible)
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


def policy_shares(*, arms: Sequence[ArmView], config: RoutingConfig) -> list[float]:
    """Each arm's expected share of traffic under ``choose_arm`` (``adr0021``), in order."""
    shares = [0.0] * len(arms)
    eligible = [i for i, arm in enumerate(arms) if arm.status is not ArmStatus.QUARANTINED]
    if not eligible:
        return shares
    proven = [i for i in eligible if arms[i].status is ArmStatus.PROVEN]
    if not proven:
        shares[eligible[0]] = 1.0
        return shares
    exploit_share = 1.0
    target = _scout_target([arms[i] for i in eligible])
    if target is not None and config.explore_share > 0:
        shares[eligible[target]] = config.explore_share
        exploit_share = 1.0 - config.explore_share
    weights = _exploit_weights([arms[i] for i in proven], config.weight_alpha)
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
    """The active policy's pick among ``arms`` (best prior first); ``None`` when all are held."""
    if config.policy == POLICY_ADR0021:
        return choose_arm(arms=arms, config=config, rng=rng)
    picked = thompson.choose_arm(arms=arms, loads=loads, config=config, rng=rng)
    return None if picked is None else (picked[0], DecisionMode(picked[1]))


def route_shares(
    *, arms: Sequence[ArmView], config: RoutingConfig, loads: LoadSnapshot = NO_LOAD
) -> list[float]:
    """Each arm's expected share of traffic under the active policy, in the order given."""
    if config.policy == POLICY_ADR0021:
        return policy_shares(arms=arms, config=config)
    return thompson.expected_shares(arms=arms, loads=loads, config=config)


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
